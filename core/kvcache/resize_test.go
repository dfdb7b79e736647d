package kvcache

import (
	"errors"
	"testing"
)

// Seed commit 6: a bound is released by a failed first-chunk resize while the chunk is
// unconsumed, so the headroom it held goes to the requests admitted after it.
func TestFailedFirstChunkResizeReleasesTheReservation(t *testing.T) {
	const T = 4
	m := newManager(t, Config{TokensPerBlock: T, Pools: pools(6), EnableCompletionReservation: true, Disaggregated: true}, nil, Options{})
	// Request 1: a 2-block first chunk of a 5-block prompt, bound through the prompt.
	_, err := m.Allocate(1, Prompt{Tokens: seq(1, 20)}, 8)
	must(t, err)
	must(t, m.AdmitContext(1, 20))
	if n, blocks := m.ReservationsHeld(); n != 1 || blocks != 3 {
		t.Fatalf("held %d reservations of %d blocks, want 1 of 3", n, blocks)
	}
	// Request 2 fits only if request 1's remaining 3 blocks are not reserved.
	_, err = m.Allocate(2, Prompt{Tokens: seq(100, 4)}, 4)
	must(t, err)
	if err := m.AdmitContext(2, 12); !errors.Is(err, ErrNoReservation) {
		t.Fatalf("request 2 admitted against request 1's reservation: %v", err)
	}
	// A resize past the pools fails: request 1 keeps its pages, its bound is released.
	if err := m.ResizeFirstChunk(1, 40); !errors.Is(err, ErrOutOfPages) {
		t.Fatalf("resize past the pools = %v, want ErrOutOfPages", err)
	}
	if held, _ := m.Held(1); held != 2 {
		t.Fatalf("request 1 holds %d blocks after the failed resize, want its 2", held)
	}
	if _, ok := m.Reservation(1); ok {
		t.Fatal("a failed first-chunk resize kept the reservation")
	}
	must(t, m.AdmitContext(2, 12))
	if n, blocks := m.ReservationsHeld(); n != 1 || blocks != 2 {
		t.Fatalf("held %d reservations of %d blocks, want 1 of 2", n, blocks)
	}
	// A resize that fits keeps the bound.
	must(t, m.ResizeFirstChunk(2, 8))
	if b, ok := m.Reservation(2); !ok || b != 3 {
		t.Fatalf("bound after a successful resize = %d, %v", b, ok)
	}
	if err := m.ResizeFirstChunk(9, 4); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("resize of an unknown request = %v", err)
	}
}
