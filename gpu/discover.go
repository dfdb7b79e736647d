package gpu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Inventory is what discovery found on this machine. A machine without an NVIDIA driver has an
// empty inventory; NoGPUReason then says why.
type Inventory struct {
	Driver      string   `json:"driver,omitempty"`
	GPUs        []Device `json:"gpus"`
	NoGPUReason string   `json:"no_gpu_reason,omitempty"`
}

// Device is one GPU as NVML reports it. Fields NVML does not know for a device are left at
// their zero value, NUMANode at -1.
type Device struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	PCIBusID    string `json:"pci_bus_id,omitempty"`
	MemoryTotal uint64 `json:"memory_total"`
	MemoryFree  uint64 `json:"memory_free"`
	PCIeGen     int    `json:"pcie_gen"`
	PCIeMaxGen  int    `json:"pcie_max_gen"`
	PCIeWidth   int    `json:"pcie_width"`
	NUMANode    int    `json:"numa_node"`
	// CPUAffinity lists the CPUs close to the device in the kernel's list syntax ("0-15,32-47").
	CPUAffinity string `json:"cpu_affinity,omitempty"`
	MIG         bool   `json:"mig"`
}

// cpuList renders a CPU bitmask (64 CPUs per word, lowest first) in the kernel's list syntax.
func cpuList(words []uint64) string {
	var parts []string
	n := len(words) * 64
	for i := 0; i < n; {
		if words[i/64]&(1<<(i%64)) == 0 {
			i++
			continue
		}
		j := i
		for j+1 < n && words[(j+1)/64]&(1<<((j+1)%64)) != 0 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(i))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", i, j))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// sysfsBusID turns NVML's bus id ("00000000:3B:00.0") into the form sysfs uses ("0000:3b:00.0").
func sysfsBusID(nvmlID string) string {
	id := strings.ToLower(strings.TrimSpace(nvmlID))
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) > 4 {
		id = dom[len(dom)-4:] + ":" + rest
	}
	return id
}

// numaNodeOf reads the NUMA node of a PCI device from sysfs; -1 when unknown.
func numaNodeOf(busID string) int {
	if busID == "" {
		return -1
	}
	b, err := os.ReadFile("/sys/bus/pci/devices/" + sysfsBusID(busID) + "/numa_node")
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}
