package connector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// wakingMover records, in order, when its device is woken and when pages are scattered, and
// fails to wake when told to.
type wakingMover struct {
	checkingMover
	mu      *sync.Mutex
	events  *[]string
	wakeErr error
}

func (m wakingMover) note(e string) {
	m.mu.Lock()
	*m.events = append(*m.events, e)
	m.mu.Unlock()
}

func (m wakingMover) WakeDevice() error { m.note("wake"); return m.wakeErr }

func (m wakingMover) ScatterChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (func() ([]bool, error), error) {
	m.note(fmt.Sprintf("scatter %d", len(pages)))
	return m.checkingMover.ScatterChecked(ctx, src, pages, sums)
}

func (m wakingMover) Clone() (kvmem.Mover, error) {
	c, _ := m.checkingMover.Clone()
	return wakingMover{c.(checkingMover), m.mu, m.events, m.wakeErr}, nil
}

// TestLoadWakesDeviceFirst: a load wakes the mover's device once, before its first copy, so the
// device switches to this process while the host looks the pages up; a StartLoad with nothing
// bound leaves it alone; wakeDeviceOff turns it off; a device that fails to wake does not fail
// the load (its copies decide).
func TestLoadWakesDeviceFirst(t *testing.T) {
	const n = 6
	for _, c := range []struct {
		name    string
		off     bool
		wakeErr error
		want    []string
	}{
		{"wakes", false, nil, []string{"wake", "scatter 6"}},
		{"wake fails", false, errors.New("no device"), []string{"wake", "scatter 6"}},
		{"off", true, nil, []string{"scatter 6"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func(old bool) { wakeDeviceOff = old }(wakeDeviceOff)
			wakeDeviceOff = c.off
			pool := newEmbPool(t, 4<<20)
			l := testLayout(32)
			src := saveDirectPages(t, pool, l, n)
			var events []string
			m := wakingMover{newCheckingMover(l), new(sync.Mutex), &events, c.wakeErr}
			w := registeredWorker(t, pool, m, l)
			if err := w.StartLoad(context.Background()); err != nil {
				t.Fatal(err)
			}
			if len(events) != 0 {
				t.Fatalf("a StartLoad with nothing bound did %v", events)
			}
			var reqs []RequestTransfers
			for i := range n {
				reqs = append(reqs, RequestTransfers{RequestID: fmt.Sprintf("r%d", i), Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: 16 + i}}})
			}
			w.BindMeta(Metadata{Loads: reqs})
			if err := w.StartLoad(context.Background()); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(events) != fmt.Sprint(c.want) {
				t.Fatalf("events %v, want %v", events, c.want)
			}
			if f := w.TakeFailedLoadRequests(); len(f) != 0 {
				t.Fatalf("failed loads %v", f)
			}
			for i := range n {
				want := pageBytes(src, 0, i, false)
				if got := pageBytes(m.hostMover, 0, 16+i, false); string(got) != string(want) {
					t.Fatalf("page %d did not land", i)
				}
			}
		})
	}
}

// TestWakeForLoads: WakeForLoads wakes the device when loads are bound and only then; the
// StartLoad right after it does not wake it again, one after wakeFresh does, and a closed worker
// is left alone.
func TestWakeForLoads(t *testing.T) {
	const n = 4
	pool := newEmbPool(t, 4<<20)
	l := testLayout(32)
	saveDirectPages(t, pool, l, n)
	var events []string
	m := wakingMover{newCheckingMover(l), new(sync.Mutex), &events, nil}
	w := registeredWorker(t, pool, m, l)
	bind := func(tag string) {
		var reqs []RequestTransfers
		for i := range n {
			reqs = append(reqs, RequestTransfers{RequestID: fmt.Sprintf("%s%d", tag, i), Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: 16 + i}}})
		}
		w.BindMeta(Metadata{Loads: reqs})
	}
	w.WakeForLoads()
	if len(events) != 0 {
		t.Fatalf("woken with nothing bound: %v", events)
	}
	bind("a")
	w.WakeForLoads()
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(events); got != fmt.Sprint([]string{"wake", "scatter 4"}) {
		t.Fatalf("WakeForLoads, then StartLoad: %v, want one wake before the scatter", got)
	}
	events = events[:0]
	bind("b")
	w.WakeForLoads()
	time.Sleep(wakeFresh + time.Millisecond)
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(events); got != fmt.Sprint([]string{"wake", "wake", "scatter 4"}) {
		t.Fatalf("StartLoad %v after WakeForLoads: %v, want it to wake the device again", wakeFresh, got)
	}
	events = events[:0]
	bind("c")
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.WakeForLoads()
	if len(events) != 0 {
		t.Fatalf("a closed worker woke its device: %v", events)
	}
}
