package daemon

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// stepMetadata is one scheduler step's metadata: reqs requests of pages pages each, loads for
// half of them and saves for the rest.
func stepMetadata(step, reqs, pages int) connector.Metadata {
	var m connector.Metadata
	for r := range reqs {
		t := connector.RequestTransfers{RequestID: fmt.Sprintf("s%d-r%d", step, r)}
		for p := range pages {
			var h keys.Hash
			binary.LittleEndian.PutUint64(h[:], uint64(step)<<32|uint64(r)<<16|uint64(p))
			t.Pages = append(t.Pages, connector.PageTransfer{Hash: keys.PageHashOf(h), Group: 0, Page: (r*pages + p) % 4096})
		}
		if r%2 == 0 {
			m.Loads = append(m.Loads, t)
		} else {
			m.Saves = append(m.Saves, t)
		}
	}
	return m
}

// BenchmarkBindMetaChecks measures what the offer check adds to a BuildMeta/BindMeta round per
// step: the baseline is the layout check BindMeta always did; the other records the step's
// offers (BuildMeta) and checks every page against them (BindMeta), with seven older steps
// held, as in steady state.
func BenchmarkBindMetaChecks(b *testing.B) {
	for _, size := range []struct{ reqs, pages int }{{8, 16}, {64, 32}, {256, 64}} {
		e := &engine{name: "e", layout: kvmem.Layout{TokensPerBlock: 16, Groups: []kvmem.GroupLayout{{Slots: 4096}}}, offers: &offers{}}
		e.scheduler = &connector.Scheduler{}
		d := &Daemon{engines: map[string]*engine{"e": e}}
		for s := range offerGenerations {
			e.offers.record(stepMetadata(-1-s, size.reqs, size.pages))
		}
		m := stepMetadata(0, size.reqs, size.pages)
		name := fmt.Sprintf("pages=%d", size.reqs*size.pages)
		b.Run(name+"/layout-check", func(b *testing.B) {
			for b.Loop() {
				if err := e.checkTransfers(m); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/layout+offers", func(b *testing.B) {
			for b.Loop() {
				e.offers.record(m)
				if err := e.checkTransfers(m); err != nil {
					b.Fatal(err)
				}
				if err := d.checkOffered(e, m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
