package daemon

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

func openFDs(t *testing.T) uint64 {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return uint64(len(ents))
}

// TestAcceptSurvivesEMFILE runs a real listener out of descriptors: accept fails with EMFILE,
// and the guarded listener backs off and retries instead of returning the error (which made the
// daemon exit); once descriptors are free again the waiting connections are accepted.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := newGuardedListener(raw, "test", 100, nil, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	defer g.Close()
	const n = 6
	var clients []net.Conn
	for range n {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	tight := old
	tight.Cur = openFDs(t) + 2
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &tight); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
		}
	}
	defer restore()

	accepted := make(chan net.Conn, n)
	errc := make(chan error, 1)
	go func() {
		for range n {
			c, err := g.Accept()
			if err != nil {
				errc <- err
				return
			}
			accepted <- c
		}
	}()
	deadline := time.After(10 * time.Second)
	for g.counts.acceptErrs.Load() == 0 {
		select {
		case err := <-errc:
			t.Fatalf("accept returned %v instead of retrying", err)
		case <-deadline:
			t.Fatal("accept never ran out of descriptors; the test did not test EMFILE")
		case <-time.After(5 * time.Millisecond):
		}
	}
	restore()
	for i := range n {
		select {
		case c := <-accepted:
			_ = c.Close()
		case err := <-errc:
			t.Fatalf("accept %d: %v", i, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d connections accepted after descriptors were freed", i, n)
		}
	}
}

// TestListenerCap: connections over the cap are accepted and closed at once; a slot comes back
// when a connection closes.
func TestListenerCap(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := newGuardedListener(raw, "test", 2, nil, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	defer g.Close()
	got := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := g.Accept()
			if err != nil {
				return
			}
			got <- c
		}
	}()
	var held []net.Conn
	for range 2 {
		c, _ := net.Dial("tcp", raw.Addr().String())
		defer c.Close()
		held = append(held, <-got)
	}
	over, _ := net.Dial("tcp", raw.Addr().String())
	defer over.Close()
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := over.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("a connection over the cap was not closed: %v", err)
	}
	if g.counts.overCap.Load() != 1 {
		t.Errorf("over-cap count %d, want 1", g.counts.overCap.Load())
	}
	_ = held[0].Close()
	c, _ := net.Dial("tcp", raw.Addr().String())
	defer c.Close()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Error("a freed slot was not given to the next connection")
	}
}

// TestAggregatorFolds: the first warning of a kind is logged, repeats are counted and written
// as one line with the count when the window ends; kinds differ by the logger's attributes.
func TestAggregatorFolds(t *testing.T) {
	var buf bytes.Buffer
	a := newAggregator(slog.NewTextHandler(&buf, nil), time.Hour)
	log := slog.New(a.handler())
	e1, e2 := log.With("engine", "a"), log.With("engine", "b")
	for i := range 1000 {
		e1.Warn("mooncake-store rank 0 failed to save " + strings.Repeat("1", i%3+1) + " of 8 pages")
	}
	e2.Warn("mooncake-store rank 0 failed to save 3 of 8 pages")
	log.Info("not folded")
	log.Info("not folded")
	a.stop()
	out := buf.String()
	if n := strings.Count(out, "failed to save"); n != 3 {
		t.Errorf("%d lines about failed saves, want 3 (first of a, first of b, count of a):\n%s", n, out)
	}
	if !strings.Contains(out, "repeated=999") {
		t.Errorf("no count of the 999 folded warnings:\n%s", out)
	}
	if strings.Count(out, "not folded") != 2 {
		t.Errorf("info lines were folded:\n%s", out)
	}
}

// TestAggregatorBoundsKinds: distinct messages past the table's size are counted together.
func TestAggregatorBoundsKinds(t *testing.T) {
	var buf bytes.Buffer
	a := newAggregator(slog.NewTextHandler(&buf, nil), time.Hour)
	log := slog.New(a.handler())
	for i := range maxAggregatedKinds + 500 {
		log.Warn("kind " + strings.Repeat("x", i%2000) + "y" + strings.Repeat("z", i/2000))
	}
	a.stop()
	if n := strings.Count(buf.String(), "\n"); n > maxAggregatedKinds+2 {
		t.Errorf("%d lines for %d distinct warnings; the table is not bounded", n, maxAggregatedKinds+500)
	}
	if !strings.Contains(buf.String(), "further warnings of other kinds") {
		t.Error("the overflow was not counted")
	}
}

func TestTokenBucket(t *testing.T) {
	now := time.Unix(0, 0)
	b := newTokenBucket(10, 20, func() time.Time { return now })
	n := 0
	for range 100 {
		if b.allow() {
			n++
		}
	}
	if n != 20 {
		t.Errorf("burst: %d, want 20", n)
	}
	now = now.Add(time.Second)
	n = 0
	for range 100 {
		if b.allow() {
			n++
		}
	}
	if n != 10 {
		t.Errorf("after 1 s at 10/s: %d, want 10", n)
	}
}

// FuzzCheckRegister feeds arbitrary bytes as a RegisterRequest: the limit check never panics,
// refuses with InvalidArgument only, and what it accepts is within every limit.
func FuzzCheckRegister(f *testing.F) {
	seed, _ := proto.Marshal(&enginepb.RegisterRequest{Engine: "e", ModelKey: "m", WorldSize: 2, Rank: 1,
		Layout: &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 8, Regions: []*enginepb.Region{{Size: 64, Stride: 64}}}}}})
	f.Add(seed)
	big, _ := proto.Marshal(&enginepb.RegisterRequest{Engine: "e", ModelKey: "m", WorldSize: 1 << 30, AsyncLoadWorkers: 20000})
	f.Add(big)
	l := DefaultLimits()
	f.Fuzz(func(t *testing.T, data []byte) {
		var req enginepb.RegisterRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		err := l.checkRegister(&req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		if int(req.GetWorldSize()) > l.MaxWorldSize || req.GetWorldSize() < 0 || int(req.GetAsyncLoadWorkers()) > l.MaxAsyncLoadWorkers ||
			len(req.GetModelKey()) > l.MaxModelKeyBytes || len(req.GetLayout().GetGroups()) > l.MaxLayerGroups {
			t.Fatalf("accepted a registration over the limits: %v", &req)
		}
	})
}

// TestAggregatorKindsByAttributes: the same message about two engines (an attribute of the
// record) is two kinds; the same message differing only in numbers is one.
func TestAggregatorKindsByAttributes(t *testing.T) {
	var buf bytes.Buffer
	a := newAggregator(slog.NewTextHandler(&buf, nil), time.Hour)
	log := slog.New(a.handler())
	log.Error("engine broke the protocol", "engine", "a")
	log.Error("engine broke the protocol", "engine", "b")
	log.Warn("connection refused", "err", "peer uid 1000 (pid 17)")
	log.Warn("connection refused", "err", "peer uid 1001 (pid 18)")
	a.stop()
	out := buf.String()
	if n := strings.Count(out, "engine broke the protocol"); n != 2 {
		t.Errorf("%d lines for two engines' errors, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, "connection refused"); n != 2 || !strings.Contains(out, "repeated=1") {
		t.Errorf("refusals differing only in numbers: want the first and a count:\n%s", out)
	}
}
