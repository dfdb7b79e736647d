package gpu

import "testing"

func TestDiscover(t *testing.T) {
	inv, err := Discover()
	if err != nil {
		t.Fatalf("discover: %v", err)
	}
	if len(inv.GPUs) == 0 && inv.NoGPUReason == "" {
		t.Fatal("no GPUs and no reason given")
	}
	for _, d := range inv.GPUs {
		t.Logf("GPU %d %s %s: %d/%d bytes free, PCIe gen %d (max %d) x%d, NUMA %d, CPUs %s, MIG %v, driver %s",
			d.Index, d.Name, d.UUID, d.MemoryFree, d.MemoryTotal, d.PCIeGen, d.PCIeMaxGen, d.PCIeWidth, d.NUMANode, d.CPUAffinity, d.MIG, inv.Driver)
		if d.UUID == "" || d.MemoryTotal == 0 {
			t.Errorf("GPU %d: uuid %q, memory %d", d.Index, d.UUID, d.MemoryTotal)
		}
	}
	if len(inv.GPUs) == 0 {
		t.Logf("no GPU: %s", inv.NoGPUReason)
	}
}

func TestCPUList(t *testing.T) {
	cases := []struct {
		words []uint64
		want  string
	}{
		{[]uint64{0}, ""},
		{[]uint64{0xffff}, "0-15"},
		{[]uint64{0b1011}, "0-1,3"},
		{[]uint64{1 << 63, 1}, "63-64"},
		{[]uint64{0, 0xff00}, "72-79"},
	}
	for _, c := range cases {
		if got := cpuList(c.words); got != c.want {
			t.Errorf("cpuList(%x) = %q, want %q", c.words, got, c.want)
		}
	}
	if got := sysfsBusID("00000000:3B:00.0"); got != "0000:3b:00.0" {
		t.Errorf("sysfsBusID = %q", got)
	}
}
