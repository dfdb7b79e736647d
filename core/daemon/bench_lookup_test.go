package daemon_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
)

// BenchmarkLookupRoundTrip32k compares, on one daemon and one warm pool, a 32k-token lookup
// made in process (the connector's Scheduler.Lookup, the anchor) with the same lookup over the
// engine socket: tokens sent packed (tokens_packed), through the engine's prompt arena (the
// engine's RemoteRank, as enginesim and replay call it: the prompt written into the arena and
// only its range sent), and as the repeated varint field; and two floors: the packed prompt
// sent to an engine that is not registered (the socket's share of socket-packed) and an empty
// call (a RequestReset, the least any call over the socket costs). The chan-* modes make the
// arena lookup, the packed lookup and the empty call over a call channel of the engine's own
// connection (Client.UseCallChannels) instead of an HTTP/2 stream; they run last, once the
// socket modes are done, because switching the client moves its RemoteRank to channels too.
// One run times every mode
// once, one after the other, against the same warm pool. -count N repeats each mode N times in a
// row before the next (that is how the testing package runs sub-benchmarks), so to alternate
// the modes under the same machine load, run the binary N times instead:
//
//	go test -c -o daemon.test ./core/daemon/
//	for i in 1 2 3 4; do ./daemon.test -test.run '^$' -test.bench 'LookupRoundTrip32k' -test.benchtime 2000x; done
//
// (or go test -run '^$' -bench 'LookupRoundTrip32k' -benchtime 2000x ./core/daemon/ four times).
func BenchmarkLookupRoundTrip32k(b *testing.B) {
	const tokens = 32 << 10
	r := benchStart(b, 256<<20)
	ctx := context.Background()
	blocks := tokens / benchT
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "bench-model", Name: "lk", TokensPerBlock: benchT,
		Slots: blocks + 1, PageBytes: []int{16 << 10}, Chunk: 8 << 10, NoCallChannels: true}
	e, err := enginesim.Start(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(ctx)
	prompt := randTokens(uint64(tokens), tokens)
	if _, err := e.Run(ctx, []enginesim.Request{{ID: "fill", Tokens: prompt}}, 0); err != nil {
		b.Fatal(err)
	}
	want := (tokens - 1) / benchT * benchT
	sc, err := daemon.SchedulerOf(r.Daemon, "lk/rank0")
	if err != nil {
		b.Fatal(err)
	}
	// The engine's own connection: only the connection that registered an engine may call it.
	c := e.Client(0)

	type lookupFn func(id string) (int, error)
	inproc := func(id string) (int, error) {
		n, _, err := sc.Lookup(ctx, connector.Request{ID: id, Tokens: prompt, ContextOnly: true}, 0)
		return n, err
	}
	overSocket := func(packed bool) lookupFn {
		req := &enginepb.LookupRequest{Engine: "lk/rank0", Request: &enginepb.Request{ContextOnly: true}}
		return func(id string) (int, error) {
			req.Request.Id = id
			if packed {
				engineapi.SetRequestTokens(req.Request, prompt)
			} else {
				req.Request.Tokens = prompt
			}
			resp, err := c.Lookup(ctx, req)
			return int(resp.GetMatchedTokens()), err
		}
	}

	// overArena is the engine's own RemoteRank, which writes the prompt into its prompt arena
	// and sends the range.
	rk := e.Remote(0)
	if _, err := rk.PromptArena(ctx); err != nil {
		b.Fatalf("the engine has no prompt arena: %v", err)
	}
	overArena := func(id string) (int, error) {
		n, _, err := rk.Lookup(ctx, connector.Request{ID: id, Tokens: prompt, ContextOnly: true}, 0)
		return n, err
	}
	// transportOnly sends the same packed prompt to an engine that is not registered: the daemon
	// decodes the message and answers NotFound, so this is the socket's share without the lookup.
	transportOnly := func(id string) (int, error) {
		req := &enginepb.LookupRequest{Engine: "nobody", Request: &enginepb.Request{Id: id, ContextOnly: true}}
		engineapi.SetRequestTokens(req.Request, prompt)
		_, err := c.Lookup(ctx, req)
		if status.Code(err) != codes.NotFound {
			return 0, fmt.Errorf("lookup for an unknown engine: %w", err)
		}
		return want, nil
	}
	// emptyCall is the smallest call over the socket, a RequestReset of a request the engine
	// does not track: what any call costs, prompt or not.
	emptyCall := func(id string) (int, error) {
		_, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "lk/rank0", RequestId: "none-" + id})
		return want, err
	}
	for _, m := range []struct {
		name string
		fn   lookupFn
	}{
		{"in-process", inproc},
		{"socket-packed", overSocket(true)},
		{"socket-arena", overArena},
		{"socket-repeated", overSocket(false)},
		{"socket-transport-only", transportOnly},
		{"socket-empty-call", emptyCall},
		{"chan-arena", overArena},
		{"chan-packed", overSocket(true)},
		{"chan-empty-call", emptyCall},
	} {
		if strings.HasPrefix(m.name, "chan-") && c.CallChannels() == nil {
			if err := c.UseCallChannels(ctx, 1); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(m.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, 4096)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("%s-%d", m.name, i)
				t0 := time.Now()
				n, err := m.fn(id)
				lat = append(lat, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				if n != want {
					b.Fatalf("lookup matched %d tokens, want %d", n, want)
				}
				b.StopTimer()
				sc.RequestReset(id, false)
				b.StartTimer()
			}
			if m.name == "socket-arena" || m.name == "chan-arena" {
				if _, packed := rk.PromptCounts(); packed != 0 {
					b.Fatalf("%d lookups went packed instead of through the arena", packed)
				}
			}
			if p := c.CallChannels(); strings.HasPrefix(m.name, "chan-") {
				if _, fallbacks := p.Stats(); fallbacks != 0 {
					b.Fatalf("%d calls went over gRPC instead of the call channel", fallbacks)
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(percentile(lat, 0.50).Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(percentile(lat, 0.99).Nanoseconds()), "p99-ns")
		})
	}
}
