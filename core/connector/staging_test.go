package connector

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Seed commit 17: staging_buffer_bytes is the pinned memory per direction that the node budget
// counts. With asynchronous loads each load worker gets an even share of the load direction and
// no synchronous load pool is pinned, so the staging a worker really makes never exceeds the
// counted amount, above the old 1 GiB ceiling too; a share below one page gets one slot and a
// warning.
func TestPinnedStagingEqualsTheCountedBudget(t *testing.T) {
	l := testLayout(16)
	slot := int64(l.MaxValueSize())
	for _, c := range []struct {
		name    string
		budget  int64
		workers int // 0: synchronous loads
		batch   int
	}{
		{"sync", 40 * slot, 0, 64},
		{"async, share below the batch", 40 * slot, 4, 64},
		{"async, share above the old floor", 1000 * slot, 4, 128},
		{"async, one slot each", 5 * slot, 5, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var made []*hostStaging
			m := &trackingMover{hostMover: newHostMover(l), made: &made, mu: &mu}
			o := baseOptions()
			o.StagingBufferBytes, o.TransferBatchSize = c.budget, c.batch
			if c.workers > 0 {
				o.AsyncLoad, o.AsyncLoadWorkers = true, c.workers
			}
			w, err := NewWorker(o, newMemPool(), m)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.RegisterLayout(l); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = w.Close(context.Background()) })
			mu.Lock()
			defer mu.Unlock()
			var load, save int64
			var loadPools int
			for _, s := range made {
				bytes := int64(s.slots * s.slotBytes)
				if s == made[len(made)-1] {
					save += bytes // the save staging is made last
					continue
				}
				load += bytes
				loadPools++
			}
			if want := max(c.workers, 1); loadPools != want {
				t.Fatalf("%d load staging pools, want %d", loadPools, want)
			}
			if load > c.budget || save > c.budget {
				t.Fatalf("pinned %d bytes for loads and %d for saves, more than the %d the budget counts per direction", load, save, c.budget)
			}
			// Nothing of the budget is left unused beyond what whole slots and the batch allow.
			share := c.budget / int64(max(c.workers, 1))
			if perPool := min(share/slot, int64(c.batch)) * slot; load != perPool*int64(loadPools) {
				t.Fatalf("load staging %d bytes, want %d pools of %d", load, loadPools, perPool)
			}
		})
	}
	// A share below one page registers with one slot per pool and a warning (seed commit 17,
	// staging.py's max(1, …)), rather than being refused.
	var mu sync.Mutex
	var made []*hostStaging
	var logged bytes.Buffer
	o := baseOptions()
	o.StagingBufferBytes, o.AsyncLoad, o.AsyncLoadWorkers = 3*slot, true, 4
	o.Logger = slog.New(slog.NewTextHandler(&syncWriter{w: &logged}, nil))
	w, err := NewWorker(o, newMemPool(), &trackingMover{hostMover: newHostMover(l), made: &made, mu: &mu})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	if err := w.RegisterLayout(l); err != nil {
		t.Fatalf("a share below one page = %v, want a warning, not a refusal", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(made) != 5 {
		t.Fatalf("%d staging pools, want 4 load pools and one save pool", len(made))
	}
	for _, s := range made[:4] {
		if s.slots != 1 {
			t.Fatalf("a load pool below one page has %d slots, want 1", s.slots)
		}
	}
	if !strings.Contains(logged.String(), "less than one") {
		t.Fatalf("no warning about the share below one page in %q", logged.String())
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
