package connector

import (
	"context"
	"errors"
	"testing"
)

// FuzzWorkerProtocol drives a worker with an engine's calls chosen by the input: bind passes
// with loads, saves and parked loads for a few request ids, announce loads, drop saves and take
// failures, in any order. Whatever a hostile engine sends, a call either succeeds or fails
// with a protocol error (misreported id, untaken failures) that is then kept; nothing panics
// and the worker's protocol memory stays bounded by the pass.
func FuzzWorkerProtocol(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5})
	f.Add([]byte{2, 0x12, 1, 0x12, 1, 0x12})
	f.Add([]byte{0, 0x33, 3, 0x41, 4, 5, 2, 0x13})
	ids := []string{"a", "b", "c", "d"}
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 256 {
			ops = ops[:256]
		}
		o := baseOptions()
		o.AsyncLoad, o.AsyncLoadWorkers = true, 1
		w, err := NewWorker(o, newMemPool(), newHostMover(testLayout(8)))
		if err != nil {
			t.Fatal(err)
		}
		if err := w.RegisterLayout(testLayout(8)); err != nil {
			t.Fatal(err)
		}
		defer w.Close(context.Background())
		var kept error
		check := func(err error) {
			if err == nil {
				return
			}
			if !errors.Is(err, ErrMisreportedRequest) && !errors.Is(err, ErrFailedLoadsNotTaken) {
				t.Fatalf("unexpected error: %v", err)
			}
			if kept == nil {
				kept = err
			}
			if got := w.Err(); got == nil || got.Error() != kept.Error() {
				t.Fatalf("kept error %v, want the first protocol error %v", got, kept)
			}
		}
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%6, ops[i+1]
			id := ids[int(arg)%len(ids)]
			switch op {
			case 0: // bind a pass: saves for one id, a parked (empty) load for another
				w.BindMeta(Metadata{
					Saves:      []RequestTransfers{{RequestID: id, Pages: []PageTransfer{{Page: int(arg) % 8}}}},
					AsyncLoads: []RequestTransfers{{RequestID: ids[int(arg>>4)%len(ids)]}},
				})
			case 1:
				_, _, err := w.GetFinished(nil, []string{id})
				check(err)
			case 2:
				check(w.DropBoundSaves([]string{id}))
			case 3:
				w.TakeFailedAsyncLoadRequests()
			case 4:
				check(w.StartLoad(context.Background()))
			case 5:
				w.TakeFailedLoadRequests()
			}
			w.mu.Lock()
			if n := len(w.protocol.batch) + len(w.protocol.handedBack); n > 2*len(ids) {
				w.mu.Unlock()
				t.Fatalf("protocol memory holds %d ids after %d calls", n, i/2+1)
			}
			w.mu.Unlock()
		}
	})
}
