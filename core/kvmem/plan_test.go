package kvmem

import (
	"strings"
	"testing"
)

func layoutOf(pageBytes ...uint64) Layout {
	l := Layout{TokensPerBlock: 32}
	for i, b := range pageBytes {
		l.Groups = append(l.Groups, GroupLayout{ID: i, Slots: 8, Regions: []Region{{Stride: b, Size: b}}})
	}
	return l
}

func TestPlanStaging(t *testing.T) {
	const MiB = 1 << 20
	withReplicated := layoutOf(MiB)
	withReplicated.Groups[0].ReplicatedRegions = []Region{{Offset: 8 * MiB, Stride: 3 * MiB, Size: 3 * MiB}}
	cases := []struct {
		name          string
		layout        Layout
		batch         int
		budget        int64
		workers       int
		slot          int64
		slots, effBat int
		warn          string
	}{
		{"batch fits", layoutOf(MiB, 2*MiB), 64, 1 << 30, 1, 2 * MiB, 64, 64, ""},
		{"budget lowers the batch", layoutOf(MiB), 64, 16 * MiB, 1, MiB, 16, 16, "lowered to 16"},
		{"replicated page is widest", withReplicated, 8, 1 << 30, 1, 3 * MiB, 8, 8, ""},
		{"budget above 1 GiB is used whole", layoutOf(64 * MiB), 64, 4 << 30, 1, 64 * MiB, 64, 64, ""},
		{"async share", layoutOf(MiB), 256, 1 << 30, 4, MiB, 256, 256, ""},
		{"async share below the batch", layoutOf(8 * MiB), 128, 1 << 30, 4, 8 * MiB, 32, 32, "lowered to 32"},
		{"async share of 2 GiB", layoutOf(8 * MiB), 256, 2 << 30, 4, 8 * MiB, 64, 64, "lowered to 64"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := PlanStaging(c.layout, c.batch, c.budget, c.workers)
			if err != nil {
				t.Fatal(err)
			}
			if p.SlotBytes != c.slot || p.SlotsPerWorker != c.slots || p.Batch != c.effBat {
				t.Fatalf("got slot %d, %d slots, batch %d; want %d, %d, %d", p.SlotBytes, p.SlotsPerWorker, p.Batch, c.slot, c.slots, c.effBat)
			}
			if p.TotalBytes() > c.budget {
				t.Fatalf("plan pins %d bytes, more than the %d the node budget counts", p.TotalBytes(), c.budget)
			}
			if p.BytesPerWorker != p.SlotBytes*int64(p.SlotsPerWorker) || p.TotalBytes() != p.BytesPerWorker*int64(c.workers) {
				t.Fatalf("bytes per worker %d, total %d", p.BytesPerWorker, p.TotalBytes())
			}
			joined := strings.Join(p.Warnings, "\n")
			if c.warn == "" && joined != "" || !strings.Contains(joined, c.warn) {
				t.Fatalf("warnings %q, want one containing %q", joined, c.warn)
			}
		})
	}
	for _, bad := range []struct {
		batch   int
		budget  int64
		workers int
	}{{0, 1, 1}, {1, 0, 1}, {1, 1, 0}} {
		if _, err := PlanStaging(layoutOf(4096), bad.batch, bad.budget, bad.workers); err == nil {
			t.Errorf("PlanStaging(batch %d, budget %d, workers %d) succeeded", bad.batch, bad.budget, bad.workers)
		}
	}
	// A share below one page is warned about and still gets one slot (seed commit 17,
	// staging.py's max(1, …)): the pool pins one page although the budget counted less.
	for _, small := range []struct {
		budget  int64
		workers int
	}{{MiB, 1}, {32 * MiB, 32}, {4*MiB*32 - 1, 32}} {
		p, err := PlanStaging(layoutOf(4*MiB), 4, small.budget, small.workers)
		if err != nil {
			t.Errorf("PlanStaging(budget %d, %d workers) = %v, want a warning, not an error", small.budget, small.workers, err)
			continue
		}
		if p.SlotsPerWorker != 1 || p.Batch != 1 || p.BytesPerWorker != 4*MiB {
			t.Errorf("PlanStaging(budget %d, %d workers) = %+v, want one 4 MiB slot per worker", small.budget, small.workers, p)
		}
		if joined := strings.Join(p.Warnings, "\n"); !strings.Contains(joined, "less than one") || !strings.Contains(joined, "pins one page anyway") {
			t.Errorf("PlanStaging(budget %d, %d workers) warnings %q, want the below-one-page warning", small.budget, small.workers, joined)
		}
	}
	if _, err := PlanStaging(Layout{}, 1, 1, 1); err == nil {
		t.Error("PlanStaging of an empty layout succeeded")
	}
}
