package radix

import "testing"

// FuzzRadixOps runs a byte-coded sequence of inserts, claims, releases, touches, evictions
// and matches against a small tree and checks the invariants after every operation.
func FuzzRadixOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 0, 17, 33, 49, 65, 1, 2, 3, 4})
	f.Add([]byte{16, 255, 3, 0, 4, 128, 2, 2, 2, 5, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		const T = 3
		tr, err := New(Config{TokensPerBlock: T, StoreTokens: len(data)%2 == 0, PartialScanLimit: 2})
		if err != nil {
			t.Fatal(err)
		}
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		prompt := func() []int64 {
			n := int(next()%10) + 1
			p := make([]int64, n)
			for i := range p {
				p[i] = int64(next() % 3)
			}
			return p
		}
		var held []NodeID
		for len(data) > 0 {
			switch next() % 6 {
			case 0:
				if _, err := tr.InsertChain(nil, Root, blocksOf(prompt(), T)); err != nil {
					t.Fatal(err)
				}
			case 1:
				p := prompt()
				b := int(next() % 8)
				a := []int{1, 3}[next()%2]
				m, err := tr.Match(queryOf(p, T), MatchOptions{PartialReuse: true, Backoff: b, Alignment: a})
				if err != nil {
					t.Fatal(err)
				}
				if m.Tokens > m.RawTokens || m.Tokens > len(p) || m.Tokens%a != 0 || m.Tokens != Trim(m.RawTokens, b, a) {
					t.Fatalf("match %+v for %d tokens, backoff %d alignment %d", m, len(p), b, a)
				}
				if err := tr.Acquire(m.Blocks...); err != nil {
					t.Fatal(err)
				}
				held = append(held, m.Blocks...)
			case 2:
				if len(held) > 0 {
					i := int(next()) % len(held)
					if err := tr.Release(held[i]); err != nil {
						t.Fatal(err)
					}
					held = append(held[:i], held[i+1:]...)
				}
			case 3:
				tr.Evict(int(next()%4)+1, nil)
			case 4:
				m, _ := tr.Match(queryOf(prompt(), T), MatchOptions{})
				tr.Touch(m.Blocks...)
			case 5:
				// Releasing one node more often than it is held is refused as a whole.
				if len(held) > 0 {
					id := held[0]
					count := 0
					for _, h := range held {
						if h == id {
							count++
						}
					}
					over := make([]NodeID, count+1)
					for i := range over {
						over[i] = id
					}
					if err := tr.Release(over...); err == nil {
						t.Fatalf("released node %d %d times while held %d times", id, count+1, count)
					}
					if info, _ := tr.Info(id); info.Refs != count {
						t.Fatalf("refused release changed refs of %d to %d, want %d", id, info.Refs, count)
					}
				}
			}
			if err := tr.Check(); err != nil {
				t.Fatal(err)
			}
		}
		for _, h := range held {
			if err := tr.Release(h); err != nil {
				t.Fatalf("release of held %d: %v", h, err)
			}
		}
		tr.Evict(1<<30, nil)
		if tr.Len() != 0 {
			t.Fatalf("%d blocks left", tr.Len())
		}
	})
}
