package engineapi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool/embedded"
)

func startDaemon(t *testing.T, limits daemon.Limits) *daemontest.Running {
	t.Helper()
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 16 << 20}}
	return daemontest.Start(t, daemon.Config{Pool: popts, Limits: limits})
}

func dial(t *testing.T, socket string) *engineapi.Client {
	t.Helper()
	c, err := engineapi.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestCallChannelsClient switches a client to call channels against a real daemon: calls go
// over a channel (none over gRPC) and fail with the code and message the same call gets over
// gRPC; a call made while every channel is busy goes over gRPC instead of waiting; a request
// above the daemon's channel bound goes over gRPC; and Close closes the channels (the daemon's
// gauge drops to 0).
func TestCallChannelsClient(t *testing.T) {
	r := startDaemon(t, daemon.Limits{MaxCallRequestBytes: 1 << 20})
	ctx := context.Background()
	plain := dial(t, r.Info.Socket)
	c := dial(t, r.Info.Socket)
	if err := c.UseCallChannels(ctx, 1); err != nil {
		t.Fatal(err)
	}
	p := c.CallChannels()
	for _, req := range []*enginepb.RequestRef{{Engine: "nobody", RequestId: "r"}, {}} {
		_, want := plain.RequestReset(ctx, req)
		_, got := c.RequestReset(ctx, req)
		if status.Code(got) != status.Code(want) || status.Convert(got).Message() != status.Convert(want).Message() || want == nil {
			t.Errorf("RequestReset(%v): over a channel %v, over gRPC %v", req, got, want)
		}
	}
	lookup := &enginepb.LookupRequest{Engine: "nobody", Request: &enginepb.Request{Id: "x", TokensPacked: make([]byte, 64<<10)}}
	if _, err := c.Lookup(ctx, lookup); status.Code(err) != codes.NotFound {
		t.Errorf("a lookup over a channel: %v", err)
	}
	if opened, fallbacks := p.Stats(); opened != 1 || fallbacks != 0 {
		t.Errorf("opened %d channels, %d calls over gRPC; want 1 and 0", opened, fallbacks)
	}

	// The only channel is busy: the call goes over gRPC and is answered the same.
	release, ok := engineapi.HoldIdleChannel(p)
	if !ok {
		t.Fatal("no idle channel")
	}
	if _, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "nobody"}); status.Code(err) != codes.NotFound {
		t.Errorf("a call while the channel is busy: %v", err)
	}
	release()
	if _, fallbacks := p.Stats(); fallbacks != 1 {
		t.Errorf("%d calls over gRPC, want the one made while the channel was busy", fallbacks)
	}
	// Above the daemon's bound (1 MiB): over gRPC, same answer.
	lookup.Request.TokensPacked = make([]byte, 2<<20)
	if _, err := c.Lookup(ctx, lookup); status.Code(err) != codes.NotFound {
		t.Errorf("a 2 MiB lookup: %v", err)
	}
	if opened, fallbacks := p.Stats(); opened != 1 || fallbacks != 2 {
		t.Errorf("opened %d, over gRPC %d after a large request; want 1 and 2", opened, fallbacks)
	}
	if got := gauge(t, r); got != 1 {
		t.Errorf("kvctl_engine_call_channels %v, want 1", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for gauge(t, r) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the daemon still counts the closed client's channel")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCallChannelsConcurrent makes calls from many goroutines through a pool of two channels:
// every call is answered correctly, whichever path it took, and no more than two channels open.
func TestCallChannelsConcurrent(t *testing.T) {
	r := startDaemon(t, daemon.Limits{})
	ctx := context.Background()
	c := dial(t, r.Info.Socket)
	if err := c.UseCallChannels(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				name := strings.Repeat("e", g+1)
				_, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: name, RequestId: "r"})
				if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `"`+name+`"`) {
					errs <- fmt.Errorf("goroutine %d call %d: %w", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if opened, _ := c.CallChannels().Stats(); opened > 2 {
		t.Errorf("opened %d channels, the bound is 2", opened)
	}
}

func gauge(t *testing.T, r *daemontest.Running) float64 {
	t.Helper()
	resp, err := http.Get("http://" + r.Info.AdminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "kvctl_engine_call_channels "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatal("no kvctl_engine_call_channels in the scrape")
	return 0
}

// stalledChannel gives a pool a channel whose other end, held by the test, reads requests and
// never answers; it returns that end.
func stalledChannel(t *testing.T, p *engineapi.CallChannels) *net.UnixConn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		nc, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = nc.(*net.UnixConn)
	}
	t.Cleanup(func() { _ = conns[1].Close() })
	engineapi.AdoptChannel(p, conns[0], 4<<20)
	return conns[1]
}

// TestCallChannelsDeadlineAndCancel gives the pool a channel to a peer that never answers: a
// call with a deadline fails with DeadlineExceeded at its deadline, a cancelled call with
// Canceled, and each abandoned channel is closed (the peer reads end of file), not reused.
func TestCallChannelsDeadlineAndCancel(t *testing.T) {
	r := startDaemon(t, daemon.Limits{})
	p := engineapi.NewCallChannels(nil, engineapi.FDSocketPath(r.Info.Socket), 1)
	defer p.Close()
	client := enginepb.NewEngineClient(p)

	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		code codes.Code
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 200*time.Millisecond)
		}, codes.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}, codes.Canceled},
	} {
		peer := stalledChannel(t, p)
		ctx, cancel := tc.ctx()
		began := time.Now()
		_, err := client.RequestReset(ctx, &enginepb.RequestRef{Engine: "x"})
		cancel()
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
		if d := time.Since(began); d > 5*time.Second {
			t.Errorf("%s: the call returned after %v", tc.name, d)
		}
		// The peer got the request, then the channel closed.
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, engineapi.MaxCallFrameBytes+1)
		if _, err := peer.Read(buf); err != nil {
			t.Fatalf("%s: the request never arrived: %v", tc.name, err)
		}
		if _, err := peer.Read(buf); !errors.Is(err, io.EOF) {
			t.Errorf("%s: the abandoned channel was not closed: %v", tc.name, err)
		}
	}
}

// BenchmarkEmptyCall times the smallest call (a RequestReset the daemon answers NotFound) over
// gRPC and over call channels, from one goroutine and from 8 per CPU at once (b.RunParallel),
// against one real daemon in the same run. In the parallel modes the channel pool holds at most
// DefaultCallChannels channels, so some calls find every channel busy and go over gRPC: the
// figure is what a client with that many concurrent callers gets.
//
//	go test -run '^$' -bench EmptyCall -benchtime 20000x ./core/engineapi/
func BenchmarkEmptyCall(b *testing.B) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 16 << 20}}
	r := daemontest.Start(b, daemon.Config{Pool: popts})
	ctx := context.Background()
	grpcOnly, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer grpcOnly.Close()
	chans, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer chans.Close()
	if err := chans.UseCallChannels(ctx, 0); err != nil {
		b.Fatal(err)
	}
	call := func(b *testing.B, c *engineapi.Client) {
		_, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "nobody", RequestId: "r"})
		if status.Code(err) != codes.NotFound {
			b.Fatal(err)
		}
	}
	for _, m := range []struct {
		name string
		c    *engineapi.Client
	}{{"grpc", grpcOnly}, {"chan", chans}} {
		b.Run(m.name+"-serial", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				call(b, m.c)
			}
		})
		b.Run(m.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					call(b, m.c)
				}
			})
		})
	}
	opened, fallbacks := chans.CallChannels().Stats()
	b.Logf("channels opened %d, calls over gRPC because every channel was busy %d", opened, fallbacks)
}

// TestCallChannelsDialBackoff: when the daemon refuses another channel (its per-connection cap),
// the pool sends calls over gRPC without trying to open a channel for each of them.
func TestCallChannelsDialBackoff(t *testing.T) {
	r := startDaemon(t, daemon.Limits{MaxCallChannelsPerConn: 1})
	ctx := context.Background()
	c := dial(t, r.Info.Socket)
	if err := c.UseCallChannels(ctx, 4); err != nil {
		t.Fatal(err)
	}
	p := c.CallChannels()
	release, ok := engineapi.HoldIdleChannel(p)
	if !ok {
		t.Fatal("no idle channel")
	}
	for range 20 {
		if _, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "nobody"}); status.Code(err) != codes.NotFound {
			t.Fatalf("a call while the daemon refuses more channels: %v", err)
		}
	}
	if n := engineapi.DialFailures(p); n != 1 {
		t.Errorf("%d attempts to open a channel failed during 20 calls, want 1", n)
	}
	if opened, fallbacks := p.Stats(); opened != 1 || fallbacks != 20 {
		t.Errorf("opened %d, over gRPC %d; want 1 and 20", opened, fallbacks)
	}
	release()
	if _, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "nobody"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a call over the channel again: %v", err)
	}
	if _, fallbacks := p.Stats(); fallbacks != 20 {
		t.Errorf("the idle channel was not used again: %d calls over gRPC", fallbacks)
	}
}

// TestClientNeverIdles: a registration lives as long as its gRPC connection, so a client whose
// calls all go over call channels must not let that connection go idle and close. With a short
// idle timeout the daemon drops the registration while the engine keeps calling over its channel
// (what gRPC's default of 30 minutes would do); with Dial's setting it does not.
func TestClientNeverIdles(t *testing.T) {
	const idle = 200 * time.Millisecond
	for _, c := range []struct {
		name        string
		timeout     time.Duration
		wantDropped bool
	}{{"idle-timeout=200ms", idle, true}, {"dial-default", 0, false}} {
		t.Run(c.name, func(t *testing.T) {
			if c.timeout != 0 {
				defer engineapi.SetIdleTimeout(c.timeout)()
			}
			layout, size := rankLayout(8)
			r := startDaemon(t, daemon.Limits{})
			ctx := context.Background()
			cl := dial(t, r.Info.Socket)
			mem := sharedMemory(t, size)
			if _, err := cl.RegisterSharedMemory(ctx, &enginepb.RegisterRequest{
				Engine: "quiet", ModelKey: rankNamespace.ModelKey, WorldSize: 1, Role: string(connector.RoleBoth),
				Format: string(keys.FormatTRTLLM), Scheduler: true, Layout: engineapi.LayoutToPB(layout),
			}, mem.FD, uint64(size)); err != nil {
				t.Fatal(err)
			}
			if err := cl.UseCallChannels(ctx, 1); err != nil {
				t.Fatal(err)
			}
			// Calls only over the channel for five idle timeouts.
			var err error
			for end := time.Now().Add(5 * idle); time.Now().Before(end); time.Sleep(idle / 10) {
				if _, err = cl.TakeFailedLoads(ctx, &enginepb.EngineRef{Engine: "quiet"}); err != nil {
					break
				}
			}
			// Once the daemon has closed the channel with the connection, the next call finds it
			// broken before sending and goes over gRPC (a new connection), which names the
			// engine unknown.
			if _, fallbacks := cl.CallChannels().Stats(); fallbacks > 1 || (fallbacks == 1) != c.wantDropped {
				t.Fatalf("%d calls went over gRPC", fallbacks)
			}
			dropped := status.Code(err) == codes.Unavailable || status.Code(err) == codes.NotFound
			if err != nil && !dropped {
				t.Fatalf("a call over the channel: %v", err)
			}
			if dropped != c.wantDropped {
				t.Fatalf("registration dropped: %v (last call: %v), want %v", dropped, err, c.wantDropped)
			}
		})
	}
}
