//go:build cgo && linux

package gpu

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Discover lists the GPUs through NVML. A machine without the NVIDIA driver yields an empty
// inventory and no error.
func Discover() (Inventory, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND || ret == nvml.ERROR_DRIVER_NOT_LOADED || ret == nvml.ERROR_NO_PERMISSION {
			return Inventory{GPUs: []Device{}, NoGPUReason: "NVML: " + nvml.ErrorString(ret)}, nil
		}
		return Inventory{}, fmt.Errorf("discover: NVML init: %w", ret)
	}
	defer func() { _ = nvml.Shutdown() }()
	inv := Inventory{GPUs: []Device{}}
	if v, ret := nvml.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		inv.Driver = v
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return inv, fmt.Errorf("discover: count devices: %w", ret)
	}
	var errs []error
	for i := range n {
		d, err := describe(i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		inv.GPUs = append(inv.GPUs, d)
	}
	if n == 0 {
		inv.NoGPUReason = "NVML reports no devices"
	}
	return inv, errors.Join(errs...)
}

func describe(i int) (Device, error) {
	h, ret := nvml.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("discover: device %d: %w", i, ret)
	}
	d := Device{Index: i, NUMANode: -1}
	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("discover: device %d uuid: %w", i, ret)
	}
	d.Name, _ = h.GetName()
	if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		d.MemoryTotal, d.MemoryFree = m.Total, m.Free
	}
	d.PCIeGen, _ = h.GetCurrPcieLinkGeneration()
	d.PCIeMaxGen, _ = h.GetMaxPcieLinkGeneration()
	d.PCIeWidth, _ = h.GetCurrPcieLinkWidth()
	if pci, ret := h.GetPciInfo(); ret == nvml.SUCCESS {
		d.PCIBusID = cString(pci.BusId[:])
	}
	if node, ret := h.GetNumaNodeId(); ret == nvml.SUCCESS {
		d.NUMANode = node
	} else {
		d.NUMANode = numaNodeOf(d.PCIBusID)
	}
	if words, ret := h.GetCpuAffinity(max(runtime.NumCPU(), 64)); ret == nvml.SUCCESS {
		w64 := make([]uint64, len(words))
		for j, w := range words {
			w64[j] = uint64(w)
		}
		d.CPUAffinity = cpuList(w64)
	}
	if cur, _, ret := h.GetMigMode(); ret == nvml.SUCCESS {
		d.MIG = cur == nvml.DEVICE_MIG_ENABLE
	}
	return d, nil
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
