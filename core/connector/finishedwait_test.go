package connector

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
)

// GetFinishedWait, the wait of an engine with nothing to run: with nothing in flight it does
// not wait; with an announced load in flight it waits, ends with ctx's error when ctx ends, and
// is answered with the request once its pages land; a worker that fails wakes it with the error.
func TestGetFinishedWait(t *testing.T) {
	pl := newMemPool()
	opts := baseOptions()
	tokens := prompt(68, 0, 29)
	hashes := fillBlocks(t, pl, opts, tokens, 64)
	gp := &gatedGets{testPool: pl, gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	o := opts
	o.AsyncLoad, o.AsyncLoadWorkers = true, 1
	w, err := NewWorker(o, gp, newHostMover(testLayout(64)))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	if err := w.RegisterLayout(testLayout(64)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	if _, _, changed, err := w.getFinished(nil, nil); err != nil || changed != nil {
		t.Fatalf("nothing in flight: getFinished = %v, would wait %t; want no wait", err, changed != nil)
	}
	if s, l, err := w.GetFinishedWait(ctx, nil, nil, MaxFinishedWait); err != nil || len(s)+len(l) != 0 {
		t.Fatalf("nothing in flight: GetFinishedWait = %v, %v, %v; want nothing", s, l, err)
	}

	var pages []PageTransfer
	for i, h := range hashes[:7] {
		pages = append(pages, PageTransfer{Hash: keys.PageHashOf(h), Group: 0, Page: 30 + i}, PageTransfer{Hash: keys.PageHashOf(h), Group: 1, Page: 30 + i})
	}
	w.BindMeta(Metadata{AsyncLoads: []RequestTransfers{{RequestID: "p", Pages: pages}}})
	select {
	case <-gp.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the asynchronous load never reached the pool")
	}

	// The load is held in the pool's get: a wait whose ctx ends returns ctx's error (it was
	// waiting, not answered at once), and the announcement it carried is kept.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if s, l, err := w.GetFinishedWait(cctx, nil, []string{"p"}, MaxFinishedWait); !errors.Is(err, context.Canceled) || len(s)+len(l) != 0 {
		t.Fatalf("GetFinishedWait with its ctx ended = %v, %v, %v; want context.Canceled", s, l, err)
	}
	if _, _, changed, err := w.getFinished(nil, nil); err != nil || changed == nil {
		t.Fatalf("announced load in flight: getFinished = %v, would wait %t; want a wait", err, changed != nil)
	}

	// A waiter is answered with p once its pages land.
	got := make(chan []string, 1)
	errc := make(chan error, 1)
	go func() {
		for {
			_, l, err := w.GetFinishedWait(ctx, nil, nil, MaxFinishedWait)
			if err != nil || len(l) > 0 {
				got <- l
				errc <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	close(gp.gate)
	select {
	case l := <-got:
		if err := <-errc; err != nil || !slices.Equal(l, []string{"p"}) {
			t.Fatalf("GetFinishedWait after the load landed = %v, %v; want [p]", l, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was never answered")
	}
	if failed := w.TakeFailedAsyncLoadRequests(); len(failed) != 0 {
		t.Fatalf("failed loads %v", failed)
	}

	// A worker that keeps an error wakes its waiter with it.
	gp2 := &gatedGets{testPool: pl, gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	w2, err := NewWorker(o, gp2, newHostMover(testLayout(64)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { close(gp2.gate); _ = w2.Close(context.Background()) }()
	if err := w2.RegisterLayout(testLayout(64)); err != nil {
		t.Fatal(err)
	}
	w2.BindMeta(Metadata{AsyncLoads: []RequestTransfers{{RequestID: "q", Pages: pages}}})
	<-gp2.entered
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = w2.keep(errors.New("engine device lost"))
	}()
	if _, _, err := w2.GetFinishedWait(ctx, nil, []string{"q"}, MaxFinishedWait); err == nil || err.Error() != "engine device lost" {
		t.Fatalf("GetFinishedWait on a worker that failed = %v, want its error", err)
	}
}

// gatedGets is a pool whose gets wait until gate is closed; each get first sends on entered
// (when there is room).
type gatedGets struct {
	testPool
	gate    chan struct{}
	entered chan struct{}
}

func (g *gatedGets) BatchGet(ctx context.Context, keys []string, bufs [][]byte) []int64 {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.gate
	return g.testPool.BatchGet(ctx, keys, bufs)
}
