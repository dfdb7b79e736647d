package mooncake

import (
	"fmt"
	"testing"

	"github.com/kvctl/kvctl/mooncake/masterrpc"
	"github.com/kvctl/kvctl/mooncake/transfer"
)

// TestCoalesceStaysInOneBuffer checks how a batch's replicas are grouped into transfers: back
// to back in one segment, in address order, at most limit bytes a run, and never across two
// buffers of a peer's descriptor (a peer may register adjacent buffers; kvctl's server refuses a
// request spanning two) or to a peer whose buffers are unknown.
func TestCoalesceStaysInOneBuffer(t *testing.T) {
	const page = 64 << 10
	n := &Native{endpoints: map[string]peerSegment{
		// Two buffers lying back to back in memory: four pages each.
		"two": {addr: "127.0.0.1:1", desc: transfer.SegmentDesc{Buffers: []transfer.BufferDesc{
			{Name: "a", Addr: 1 << 20, Length: 4 * page}, {Name: "b", Addr: 1<<20 + 4*page, Length: 4 * page}}}},
		"one": {addr: "127.0.0.1:2", desc: transfer.SegmentDesc{Buffers: []transfer.BufferDesc{
			{Name: "a", Addr: 1 << 20, Length: 64 * page}}}},
	}}
	// Eight pages back to back from 1 MiB in each segment, listed last to first.
	var jobs []getJob
	for _, seg := range []string{"two", "one", "unresolved"} {
		for k := 7; k >= 0; k-- {
			jobs = append(jobs, getJob{i: len(jobs), rep: masterrpc.Replica{Kind: masterrpc.ReplicaMemory, Protocol: transfer.ProtocolTCP,
				Endpoint: seg, Addr: 1<<20 + uint64(k)*page, Size: page}})
		}
	}
	runs := coalesce(jobs, func(j *getJob) *masterrpc.Replica { return &j.rep }, 4*page, n.oneBuffer)
	var got []string
	for _, run := range runs {
		s := fmt.Sprintf("%s@%d", run[0].rep.Endpoint, (run[0].rep.Addr-1<<20)/page)
		for k := 1; k < len(run); k++ {
			if run[k].rep.Addr != run[k-1].rep.Addr+page {
				t.Errorf("run %s: page %d does not follow the one before", s, k)
			}
		}
		got = append(got, fmt.Sprintf("%s×%d", s, len(run)))
	}
	want := []string{"one@0×4", "one@4×4", "two@0×4", "two@4×4",
		"unresolved@0×1", "unresolved@1×1", "unresolved@2×1", "unresolved@3×1", "unresolved@4×1", "unresolved@5×1", "unresolved@6×1", "unresolved@7×1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("runs %v, want %v", got, want)
	}

	// The second buffer's first page never joins the first buffer's last, whatever the limit;
	// within one buffer pages join up to it.
	jobs = jobs[:0]
	for k := 2; k < 6; k++ {
		jobs = append(jobs, getJob{i: k, rep: masterrpc.Replica{Endpoint: "two", Addr: 1<<20 + uint64(k)*page, Size: page}})
	}
	runs = coalesce(jobs, func(j *getJob) *masterrpc.Replica { return &j.rep }, 64*page, n.oneBuffer)
	if len(runs) != 2 || len(runs[0]) != 2 || len(runs[1]) != 2 {
		t.Errorf("pages 2–5 across two buffers: %d runs, want two of two pages", len(runs))
	}
	// A replica ending past 2^64 joins nothing.
	a := masterrpc.Replica{Endpoint: "one", Addr: 1 << 20, Size: page}
	b := masterrpc.Replica{Endpoint: "one", Addr: 1<<20 + page, Size: ^uint64(0) - page}
	if n.oneBuffer(&a, &b) {
		t.Error("a replica whose end wraps past 2^64 lies in one buffer with the one before")
	}
}
