package embedded

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"testing"

	"github.com/kvctl/kvctl/pool"
)

// FuzzInPlaceOps drives the embedded pool with a sequence of puts, reservations (ended, revoked
// or left open across later operations), in-place views, gets and forced removes decoded from
// the input, on a pool small enough to run out of room. After every step it checks that every
// readable value holds exactly the bytes last written for its key, that no two live objects
// overlap in memory, and that the used bytes are the sum of the live objects' sizes; at the end
// that revoking and releasing everything leaves the accounting consistent.
func FuzzInPlaceOps(f *testing.F) {
	f.Add([]byte{0, 1, 10, 2, 1, 2, 20, 3, 3, 1, 0, 0, 4, 2, 0, 0, 5, 1, 0, 0})
	f.Add([]byte{1, 3, 200, 9, 1, 4, 255, 255, 2, 5, 9, 9, 3, 3, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0})
	f.Add(bytes.Repeat([]byte{1, 7, 90, 40, 3, 7, 0, 0, 6, 0, 0, 0}, 8))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 4*256 {
			in = in[:4*256]
		}
		o := DefaultOptions()
		o.Segments = []SegmentSpec{{Name: "a", Capacity: 48 << 10}, {Name: "b", Capacity: 16 << 10}}
		o.EvictionPeriod = 0
		o.InPlaceWorkers = 2
		p, err := NewEmbedded(o)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		ctx := context.Background()
		want := map[string][]byte{} // readable keys and their bytes
		type open struct {
			r    *pool.PutReservation
			keys []string
			vals [][]byte
		}
		var opens []open
		var views []*pool.View
		gen := 0
		value := func(size int) []byte {
			gen++
			v := make([]byte, size)
			for i := range v {
				v[i] = byte(gen*31 + i*7 + i>>8)
			}
			return v
		}
		for ; len(in) >= 4; in = in[4:] {
			op, key := in[0]%8, fmt.Sprintf("k%d", in[1]%12)
			size := 1 + (int(in[2])*int(in[3])+int(in[3]))%(20<<10)
			switch op {
			case 0: // put
				v := value(size)
				if c := p.BatchPut(ctx, []string{key}, [][]byte{v}, pool.ReplicateConfig{}); c[0] == pool.OK {
					if _, ok := want[key]; !ok && !pending(p, key) {
						want[key] = v
					}
				}
			case 1: // reserve, write, keep open
				r := p.BatchPutStart(ctx, []string{key}, []int64{int64(size)}, pool.ReplicateConfig{})
				if r.Bufs[0] != nil {
					v := value(size)
					copy(r.Bufs[0], v)
					opens = append(opens, open{r, []string{key}, [][]byte{v}})
				}
			case 2, 3: // end or revoke the oldest open reservation
				if len(opens) == 0 {
					continue
				}
				x := opens[0]
				opens = opens[1:]
				if op == 2 {
					for i, c := range x.r.End() {
						if c == pool.OK && x.r.Codes[i] == pool.OK {
							if obj := p.objs[x.keys[i]]; obj != nil && obj.complete {
								want[x.keys[i]] = x.vals[i]
							}
						}
					}
				} else {
					x.r.Revoke()
				}
			case 4: // view, keep it
				v := p.BatchView(ctx, []string{key})
				if w, ok := want[key]; ok && (v.Codes[0] != int64(len(w)) || !bytes.Equal(v.Bufs[0], w)) {
					t.Fatalf("view of %s: code %d, bytes equal %v", key, v.Codes[0], bytes.Equal(v.Bufs[0], w))
				}
				views = append(views, v)
			case 5: // release the oldest view
				if len(views) > 0 {
					views[0].Release()
					views = views[1:]
				}
			case 6: // get
				buf := make([]byte, 20<<10)
				n := p.BatchGet(ctx, []string{key}, [][]byte{buf})[0]
				if w, ok := want[key]; ok && (n != int64(len(w)) || !bytes.Equal(buf[:n], w)) {
					t.Fatalf("get of %s = %d, want %d bytes", key, n, len(w))
				}
			case 7: // forced remove
				if p.Remove(ctx, key, true) == pool.OK {
					delete(want, key)
				}
			}
			checkLayout(t, p)
		}
		for _, x := range opens {
			x.r.Revoke()
		}
		for _, v := range views {
			v.Release()
		}
		checkLayout(t, p)
		for k := range want {
			if p.Remove(ctx, k, true) != pool.OK {
				t.Fatalf("remove %s failed", k)
			}
		}
		if st, _ := p.Stats(ctx); st.UsedBytes != 0 || st.Objects != 0 || st.Detail[DetailPendingObjects] != 0 {
			t.Fatalf("empty pool: %d bytes used, %d objects, %d pending", st.UsedBytes, st.Objects, st.Detail[DetailPendingObjects])
		}
	})
}

func pending(p *Embedded, key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.objs[key]
	return o != nil && !o.complete
}

// checkLayout checks that live objects do not overlap and that used bytes add up: every object
// in the index plus removed ones still held by a reader.
func checkLayout(t *testing.T, p *Embedded) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	type span struct{ off, end int64 }
	bySeg := map[*segment][]span{}
	var sum int64
	for _, o := range p.list {
		bySeg[o.seg] = append(bySeg[o.seg], span{o.off, o.off + o.size})
		sum += o.size
	}
	for s, spans := range bySeg {
		sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
		for i := 1; i < len(spans); i++ {
			if spans[i].off < spans[i-1].end {
				t.Fatalf("segment %s: objects at [%d,%d) and [%d,%d) overlap", s.name, spans[i-1].off, spans[i-1].end, spans[i].off, spans[i].end)
			}
		}
	}
	if p.used < sum {
		t.Fatalf("used %d below the %d bytes of indexed objects", p.used, sum)
	}
	if len(p.objs) != len(p.list) {
		t.Fatalf("index %d objects, list %d", len(p.objs), len(p.list))
	}
}
