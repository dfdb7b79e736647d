package daemon_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/pool/embedded"
)

// socketPair returns both ends of a unix socket pair of type typ; the test closes them.
func socketPair(t testing.TB, typ int) [2]int {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fds[0]); _ = unix.Close(fds[1]) })
	return fds
}

// openChannel asks the daemon to make fd a call channel of c's connection.
func openChannel(ctx context.Context, c *engineapi.Client, fd int) (*enginepb.CallChannelResponse, error) {
	tok, err := engineapi.SendFD(ctx, engineapi.FDSocketPath(c.Socket()), fd)
	if err != nil {
		return nil, err
	}
	return c.OpenCallChannel(ctx, &enginepb.CallChannelRequest{FdToken: tok})
}

// rawChannel opens a call channel on c's connection and returns the engine's end of it.
func rawChannel(t testing.TB, c *engineapi.Client) *net.UnixConn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := openChannel(context.Background(), c, fds[1])
	_ = unix.Close(fds[1])
	if err != nil {
		_ = unix.Close(fds[0])
		t.Fatalf("open call channel: %v", err)
	}
	if resp.GetMaxFrameBytes() != engineapi.MaxCallFrameBytes || resp.GetMaxMessageBytes() != 4<<20 {
		t.Errorf("channel bounds %d/%d, want %d/%d", resp.GetMaxFrameBytes(), resp.GetMaxMessageBytes(), engineapi.MaxCallFrameBytes, 4<<20)
	}
	f := os.NewFile(uintptr(fds[0]), "chan")
	nc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return nc.(*net.UnixConn)
}

// sendMsg sends msg as a request of method m with call id, in frames.
func sendMsg(t testing.TB, ch *net.UnixConn, m enginepb.CallChannelMethod, id uint64, msg []byte) {
	t.Helper()
	_ = ch.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := engineapi.AppendCallFrames(nil, engineapi.CallHeader{Method: m, CallID: id}, msg, func(f []byte) error {
		_, err := ch.Write(f)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// readReply reads one whole response.
func readReply(t testing.TB, ch *net.UnixConn) (engineapi.CallHeader, []byte) {
	t.Helper()
	asm := engineapi.NewCallAssembler(engineapi.MaxMessageBytes)
	buf := make([]byte, engineapi.MaxCallFrameBytes+1)
	_ = ch.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		n, err := ch.Read(buf)
		if err != nil {
			t.Fatalf("read reply: %v", err)
		}
		msg, h, err := asm.Add(buf[:n])
		if err != nil {
			t.Fatalf("reply frame: %v", err)
		}
		if msg != nil {
			return msg.Header, append([]byte(nil), msg.Body...)
		}
		_ = h
	}
}

// chanCall makes one call of method m over ch and decodes its response into resp; the error is a
// status error built from the response as a client would.
func chanCall(t testing.TB, ch *net.UnixConn, m enginepb.CallChannelMethod, id uint64, req, resp proto.Message) error {
	t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	sendMsg(t, ch, m, id, b)
	h, body := readReply(t, ch)
	if h.CallID != id || h.Method != m {
		t.Fatalf("reply to call %d method %d, want call %d method %d", h.CallID, h.Method, id, m)
	}
	if h.Status != 0 {
		return status.Error(codes.Code(h.Status), string(body))
	}
	if err := proto.Unmarshal(body, resp); err != nil {
		t.Fatal(err)
	}
	return nil
}

// sameStatus fails unless the two errors carry the same code and message.
func sameStatus(t *testing.T, what string, grpcErr, chanErr error) {
	t.Helper()
	g, c := status.Convert(grpcErr), status.Convert(chanErr)
	if g.Code() != c.Code() || g.Message() != c.Message() {
		t.Errorf("%s: over gRPC %v %q, over the channel %v %q", what, g.Code(), g.Message(), c.Code(), c.Message())
	}
}

// TestCallChannelMatchesGRPC makes the same calls over a real daemon's gRPC socket and over a
// call channel of the same connection: lookups through a prompt arena (warm and cold),
// AdmissionQuery, RequestReset, and refusals (unknown engine, a range past the arena, a request
// id over the limit) answer with the same responses, codes and messages; the per-method call
// and error counters count the channel's calls as they count gRPC's. Then an engine whose
// client uses call channels runs warm prompts: StartLoad and the rest of the pass go over the
// channels, and every loaded byte is checked.
func TestCallChannelMatchesGRPC(t *testing.T) { eachCallPoll(t, testCallChannelMatchesGRPC) }

func testCallChannelMatchesGRPC(t *testing.T, poll time.Duration) {
	r := startPolling(t, 64<<20, poll)
	ctx := context.Background()
	const T = 16
	reqs := prompts(31, 3, T, "fill")
	e := arenaEngine(t, r.Info.Socket, "cc", reqs)
	c := e.Client(0)
	a := newArena(t, 1<<20)
	if err := c.RegisterPromptArena(ctx, "cc/rank0", a); err != nil {
		t.Fatal(err)
	}
	ch := rawChannel(t, c)
	putTokens(a, 0, reqs[0].Tokens)
	cold := prompts(99, 1, T, "cold")[0].Tokens
	putTokens(a, 64<<10, cold)
	base := "http://" + r.Info.AdminAddr
	callsOf := func(method string) float64 {
		v, _ := value(scrape(t, base), "kvctl_engine_calls_total", map[string]string{"method": method})
		return v
	}
	errorsOf := func(method, code string) float64 {
		v, _ := value(scrape(t, base), "kvctl_engine_call_errors_total", map[string]string{"method": method, "code": code})
		return v
	}
	lookupsBefore, notFoundBefore := callsOf("Lookup"), errorsOf("Lookup", "NotFound")

	var id uint64
	for _, tc := range []struct {
		name   string
		method enginepb.CallChannelMethod
		req    *enginepb.LookupRequest
	}{
		{"warm arena lookup", enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP, &enginepb.LookupRequest{Engine: "cc/rank0",
			Request: &enginepb.Request{Id: "w", ContextOnly: true, TokensArena: &enginepb.ArenaRange{Count: uint64(len(reqs[0].Tokens))}}}},
		{"cold arena lookup", enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP, &enginepb.LookupRequest{Engine: "cc/rank0",
			Request: &enginepb.Request{Id: "c", ContextOnly: true, TokensArena: &enginepb.ArenaRange{Offset: 64 << 10, Count: uint64(len(cold))}}}},
		{"admission query", enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_ADMISSION_QUERY, &enginepb.LookupRequest{Engine: "cc/rank0",
			Request: &enginepb.Request{Id: "q", ContextOnly: true, TokensArena: &enginepb.ArenaRange{Count: uint64(len(reqs[0].Tokens))}}}},
		{"packed lookup", enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP, &enginepb.LookupRequest{Engine: "cc/rank0",
			Request: &enginepb.Request{Id: "p", ContextOnly: true, TokensPacked: engineapi.PackTokens(nil, reqs[1].Tokens)}}},
		{"unknown engine", enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP, &enginepb.LookupRequest{Engine: "nobody",
			Request: &enginepb.Request{Id: "n", TokensPacked: engineapi.PackTokens(nil, cold)}}},
		{"range past the arena", enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP, &enginepb.LookupRequest{Engine: "cc/rank0",
			Request: &enginepb.Request{Id: "r", TokensArena: &enginepb.ArenaRange{Offset: a.Size() - 8, Count: 2}}}},
		{"request id over the limit", enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP, &enginepb.LookupRequest{Engine: "cc/rank0",
			Request: &enginepb.Request{Id: strings.Repeat("i", 2000), TokensPacked: engineapi.PackTokens(nil, cold)}}},
	} {
		var g *enginepb.LookupResponse
		var gerr error
		if tc.method == enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP {
			g, gerr = c.Lookup(ctx, tc.req)
		} else {
			g, gerr = c.AdmissionQuery(ctx, tc.req)
		}
		_, _ = c.RequestReset(ctx, &enginepb.RequestRef{Engine: "cc/rank0", RequestId: tc.req.GetRequest().GetId()})
		id++
		var got enginepb.LookupResponse
		cerr := chanCall(t, ch, tc.method, id, tc.req, &got)
		var reset enginepb.Empty
		id++
		if err := chanCall(t, ch, enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REQUEST_RESET, id,
			&enginepb.RequestRef{Engine: "cc/rank0", RequestId: tc.req.GetRequest().GetId()}, &reset); err != nil {
			t.Fatalf("request reset over the channel: %v", err)
		}
		sameStatus(t, tc.name, gerr, cerr)
		if gerr == nil && (got.GetMatchedTokens() != g.GetMatchedTokens() || got.GetAsync() != g.GetAsync()) {
			t.Errorf("%s: over gRPC matched %d async %v, over the channel %d %v", tc.name, g.GetMatchedTokens(), g.GetAsync(), got.GetMatchedTokens(), got.GetAsync())
		}
		if tc.name == "warm arena lookup" && (cerr != nil || got.GetMatchedTokens() != int32((len(reqs[0].Tokens)-1)/T*T)) {
			t.Errorf("warm lookup over the channel: %d, %v", got.GetMatchedTokens(), cerr)
		}
		if strings.Contains(tc.name, "lookup") && tc.name != "packed lookup" && tc.name != "admission query" && cerr != nil {
			t.Errorf("%s over the channel: %v", tc.name, cerr)
		}
	}
	// Five of the seven cases are Lookups, made once over each path; one NotFound over each.
	if got := callsOf("Lookup") - lookupsBefore; got != 12 {
		t.Errorf("kvctl_engine_calls_total{method=Lookup} grew by %v, want 12 (6 over gRPC, 6 over the channel)", got)
	}
	if got := errorsOf("Lookup", "NotFound") - notFoundBefore; got != 2 {
		t.Errorf("kvctl_engine_call_errors_total{Lookup,NotFound} grew by %v, want 2", got)
	}

	// A whole engine over call channels: register, lookups, alloc, build, bind, StartLoad,
	// saves and GetFinished, with every loaded byte checked by the simulator.
	e2, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "cc2", TokensPerBlock: T, Slots: 128, NoCallChannels: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close(ctx)
	if err := e2.Client(0).UseCallChannels(ctx, 2); err != nil {
		t.Fatal(err)
	}
	startLoads := callsOf("StartLoad")
	warmRun(ctx, t, e2, reqs, "-warm", "warm run over call channels")
	if callsOf("StartLoad") <= startLoads {
		t.Error("the run made no StartLoad")
	}
	opened, fallbacks := e2.Client(0).CallChannels().Stats()
	if opened == 0 || fallbacks != 0 {
		t.Errorf("call channels opened %d, calls over gRPC %d; want some opened and every call over them", opened, fallbacks)
	}
}

// TestCallChannelOwnership opens a channel on a second connection: it cannot touch the engine
// the first connection registered (PermissionDenied, as over that connection's gRPC), while a
// channel of the first connection can.
func TestCallChannelOwnership(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	ea := arenaEngine(t, r.Info.Socket, "owner", prompts(3, 2, 16, "o"))
	other, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	chB := rawChannel(t, other)
	chA := rawChannel(t, ea.Client(0))
	ref := &enginepb.EngineRef{Engine: "owner/rank0"}
	for i, m := range []enginepb.CallChannelMethod{
		enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_START_LOAD,
		enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_UNREGISTER,
		enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_TAKE_FAILED_LOADS,
	} {
		var out enginepb.Empty
		err := chanCall(t, chB, m, uint64(i+1), ref, &out)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "registered over another connection") {
			t.Errorf("method %d of another connection's engine over a channel: %v", m, err)
		}
	}
	var ids enginepb.RequestIDs
	if err := chanCall(t, chA, enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_TAKE_FAILED_LOADS, 1, ref, &ids); err != nil {
		t.Errorf("the owner's channel: %v", err)
	}
	if _, err := other.StartLoad(ctx, ref); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the same call over the second connection's gRPC: %v", err)
	}
}

// channelsGauge reads kvctl_engine_call_channels.
func channelsGauge(t *testing.T, r *daemontest.Running) float64 {
	t.Helper()
	v, _ := value(scrape(t, "http://"+r.Info.AdminAddr), "kvctl_engine_call_channels", nil)
	return v
}

// expectClosed waits for the daemon to close its end of ch: a read returns end of file.
func expectClosed(t *testing.T, what string, ch *net.UnixConn) {
	t.Helper()
	_ = ch.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, engineapi.MaxCallFrameBytes+1)
	for {
		_, err := ch.Read(buf)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("%s: the daemon did not close the channel: %v", what, err)
		}
	}
}

// TestCallChannelLifecycle checks that a connection's channels close when the connection ends
// and every channel when the daemon stops, that the gauge follows, and that the daemon's open
// descriptors return to where they were (it keeps none of a closed channel).
func TestCallChannelLifecycle(t *testing.T) {
	r := start(t, 16<<20)
	// The scrapes' keep-alive connection is open before the count.
	channelsGauge(t, r)
	before := processFDs(t)
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	chs := []*net.UnixConn{rawChannel(t, c), rawChannel(t, c), rawChannel(t, c)}
	if g := channelsGauge(t, r); g != 3 {
		t.Errorf("kvctl_engine_call_channels = %v with three open, want 3", g)
	}
	// A working call first: RequestReset of an unknown engine answers NotFound.
	var out enginepb.Empty
	if err := chanCall(t, chs[0], enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REQUEST_RESET, 7, &enginepb.RequestRef{Engine: "x"}, &out); status.Code(err) != codes.NotFound {
		t.Errorf("call over a fresh channel: %v", err)
	}
	_ = c.Close()
	for i, ch := range chs {
		expectClosed(t, "connection ended, channel "+string(rune('0'+i)), ch)
		_ = ch.Close()
	}
	waitFor(t, "the gauge to drop to 0", func() bool { return channelsGauge(t, r) == 0 })
	waitFor(t, "the daemon's descriptors to return", func() bool { return processFDs(t) <= before })

	// An engine that closes its own end: the daemon closes its end too.
	c2, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	ch := rawChannel(t, c2)
	_ = ch.Close()
	waitFor(t, "the channel the engine closed to go", func() bool { return channelsGauge(t, r) == 0 })

	// The daemon stopping closes the channels that are still open.
	last := rawChannel(t, c2)
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, "daemon stopped", last)
}

// TestCallChannelMalformed sends every kind of malformed input the contract lists and checks the
// error response (code, call id, a message naming the problem), that the channel still answers a
// good call afterwards, and the refused-frames counter by reason.
func TestCallChannelMalformed(t *testing.T) { eachCallPoll(t, testCallChannelMalformed) }

func testCallChannelMalformed(t *testing.T, poll time.Duration) {
	r := startPolling(t, 16<<20, poll)
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch := rawChannel(t, c)
	hdr := func(m enginepb.CallChannelMethod, flags uint8, id uint64) []byte {
		return engineapi.AppendCallHeader(nil, engineapi.CallHeader{Method: m, Flags: flags, CallID: id})
	}
	reset := enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REQUEST_RESET
	badMagic := hdr(reset, 0, 11)
	copy(badMagic, "XXXX")
	big := append(hdr(reset, 0, 12), make([]byte, engineapi.MaxCallFrameBytes)...)
	undecodable := append(hdr(reset, 0, 14), 0xff, 0xff, 0xff)
	for _, tc := range []struct {
		name   string
		frames [][]byte
		id     uint64
		code   codes.Code
		msg    string
		reason string
	}{
		{"short frame", [][]byte{{1, 2, 3}}, 0, codes.InvalidArgument, "3 bytes, shorter than the 16-byte header", "short"},
		{"bad magic", [][]byte{badMagic}, 11, codes.InvalidArgument, "magic 0x58585858", "magic"},
		{"frame over 64 KiB", [][]byte{big}, 12, codes.InvalidArgument, "a frame of more than 65536 bytes", "frame_too_large"},
		{"unknown flags", [][]byte{hdr(reset, 0x84, 13)}, 13, codes.InvalidArgument, "unknown flags 0x84", "flags"},
		{"undecodable request", [][]byte{undecodable}, 14, codes.InvalidArgument, "RequestReset request of 3 bytes does not decode", "undecodable"},
		{"unknown method", [][]byte{hdr(999, 0, 15)}, 15, codes.Unimplemented, "unknown method number 999", "unknown_method"},
		{"method 0", [][]byte{hdr(0, 0, 16)}, 16, codes.Unimplemented, "unknown method number 0", "unknown_method"},
		{"interleaved message", [][]byte{hdr(reset, engineapi.CallFrameMore, 17), hdr(reset, 0, 18)}, 17, codes.InvalidArgument, "call 17 (method 9) ended after 0 bytes without its last frame", "interleaved"},
	} {
		refusedBefore, _ := value(scrape(t, "http://"+r.Info.AdminAddr), "kvctl_engine_call_channel_refused_frames_total", map[string]string{"reason": tc.reason})
		for _, f := range tc.frames {
			if _, err := ch.Write(f); err != nil {
				t.Fatal(err)
			}
		}
		h, body := readReply(t, ch)
		if h.CallID != tc.id || codes.Code(h.Status) != tc.code || !strings.Contains(string(body), tc.msg) {
			t.Errorf("%s: reply to call %d: %v %q; want call %d, %v naming %q", tc.name, h.CallID, codes.Code(h.Status), body, tc.id, tc.code, tc.msg)
		}
		refused, _ := value(scrape(t, "http://"+r.Info.AdminAddr), "kvctl_engine_call_channel_refused_frames_total", map[string]string{"reason": tc.reason})
		if refused != refusedBefore+1 {
			t.Errorf("%s: refused frames{reason=%s} went from %v to %v, want one more", tc.name, tc.reason, refusedBefore, refused)
		}
		var out enginepb.Empty
		if err := chanCall(t, ch, reset, 100, &enginepb.RequestRef{Engine: "x"}, &out); status.Code(err) != codes.NotFound {
			t.Fatalf("%s: the channel does not answer a good call afterwards: %v", tc.name, err)
		}
	}
	// Descriptors sent along with a frame are not kept: the kernel drops them for the daemon.
	before := processFDs(t)
	pipe := make([]int, 2)
	if err := unix.Pipe2(pipe, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	frame := append(hdr(reset, 0, 20), mustMarshal(t, &enginepb.RequestRef{Engine: "x"})...)
	if _, _, err := ch.WriteMsgUnix(frame, unix.UnixRights(pipe[0]), nil); err != nil {
		t.Fatal(err)
	}
	_ = unix.Close(pipe[0])
	_ = unix.Close(pipe[1])
	if h, body := readReply(t, ch); h.CallID != 20 || codes.Code(h.Status) != codes.NotFound {
		t.Errorf("frame with a descriptor: %v %q", codes.Code(h.Status), body)
	}
	if after := processFDs(t); after > before {
		t.Errorf("the daemon's process holds %d descriptors after a frame carried one, %d before", after, before)
	}
}

// processFDs counts this process's open descriptors (the daemon runs in it).
func processFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return len(ents)
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCallChannelOversizedMessage sends a request over the daemon's bound in many frames: it is
// refused with ResourceExhausted naming the limit once its last frame arrives, and the channel
// answers the next call. A request just under the bound is served.
func TestCallChannelOversizedMessage(t *testing.T) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 16 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Limits: daemon.Limits{MaxCallRequestBytes: 1 << 20}})
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fds := socketPair(t, unix.SOCK_SEQPACKET)
	resp, err := openChannel(context.Background(), c, fds[1])
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetMaxMessageBytes() != 1<<20 {
		t.Errorf("max_message_bytes %d, want the limit %d", resp.GetMaxMessageBytes(), 1<<20)
	}
	f := os.NewFile(uintptr(fds[0]), "chan")
	nc, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ch := nc.(*net.UnixConn)
	lookup := enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP
	huge := mustMarshal(t, &enginepb.LookupRequest{Engine: "x", Request: &enginepb.Request{Id: "h", TokensPacked: make([]byte, 3<<20)}})
	tooLarge := func() float64 {
		v, _ := value(scrape(t, "http://"+r.Info.AdminAddr), "kvctl_engine_call_channel_refused_frames_total", map[string]string{"reason": "message_too_large"})
		return v
	}
	refusedBefore := tooLarge()
	sendMsg(t, ch, lookup, 41, huge)
	h, body := readReply(t, ch)
	if h.CallID != 41 || codes.Code(h.Status) != codes.ResourceExhausted || !strings.Contains(string(body), "above the limit of 1048576") || !strings.Contains(string(body), "max call request bytes") {
		t.Errorf("oversized request: call %d %v %q", h.CallID, codes.Code(h.Status), body)
	}
	if got := tooLarge() - refusedBefore; got != 1 {
		t.Errorf("refused frames{reason=message_too_large} grew by %v, want 1", got)
	}
	near := mustMarshal(t, &enginepb.LookupRequest{Engine: "x", Request: &enginepb.Request{Id: "n", TokensPacked: make([]byte, 1<<20-64)}})
	var out enginepb.LookupResponse
	if err := chanCall(t, ch, lookup, 42, &enginepb.LookupRequest{}, &out); status.Code(err) != codes.InvalidArgument {
		t.Errorf("the channel after an oversized request: %v", err)
	}
	sendMsg(t, ch, lookup, 43, near)
	if h, body := readReply(t, ch); h.CallID != 43 || codes.Code(h.Status) != codes.NotFound {
		t.Errorf("a request just under the bound: %v %q", codes.Code(h.Status), body)
	}
}

// TestCallChannelRefusedDescriptors offers descriptors that are not call channels: a pipe, a
// SOCK_STREAM and a SOCK_DGRAM unix socket pair end, a memfd, a token already claimed; each is
// refused with InvalidArgument naming what it is, the daemon keeps none of them, and no channel
// opens.
func TestCallChannelRefusedDescriptors(t *testing.T) {
	r := start(t, 16<<20)
	ctx := context.Background()
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pipe := make([]int, 2)
	if err := unix.Pipe2(pipe, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	memfd, err := unix.MemfdCreate("not-a-socket", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(memfd)
	stream := socketPair(t, unix.SOCK_STREAM)
	dgram := socketPair(t, unix.SOCK_DGRAM)
	fds := socketPair(t, unix.SOCK_SEQPACKET)
	// The gRPC connection and the scrapes' keep-alive connection are open before the count.
	if _, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "x"}); status.Code(err) != codes.NotFound {
		t.Fatal(err)
	}
	channelsGauge(t, r)
	before := processFDs(t)
	for _, tc := range []struct {
		name string
		fd   int
		msg  string
	}{
		{"pipe", pipe[0], "descriptor is a pipe, not a unix SOCK_SEQPACKET socket"},
		{"memfd", memfd, "descriptor is a regular file (or memfd), not a unix SOCK_SEQPACKET socket"},
		{"stream socket", stream[1], "descriptor is a unix SOCK_STREAM socket, not SOCK_SEQPACKET"},
		{"datagram socket", dgram[1], "descriptor is a unix SOCK_DGRAM socket, not SOCK_SEQPACKET"},
	} {
		_, err := openChannel(ctx, c, tc.fd)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want InvalidArgument naming %q", tc.name, err, tc.msg)
		}
	}
	// A token is claimed once: the second use is refused.
	tok, err := engineapi.SendFD(ctx, engineapi.FDSocketPath(r.Info.Socket), fds[1])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.OpenCallChannel(ctx, &enginepb.CallChannelRequest{FdToken: tok}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.OpenCallChannel(ctx, &enginepb.CallChannelRequest{FdToken: tok}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "unknown or expired descriptor token") {
		t.Errorf("a token used twice: %v", err)
	}
	if g := channelsGauge(t, r); g != 1 {
		t.Errorf("kvctl_engine_call_channels = %v, want only the one good channel", g)
	}
	// The daemon holds one descriptor more than before: the good channel's.
	waitFor(t, "the daemon to let go of every refused descriptor", func() bool { return processFDs(t) <= before+1 })
}

// TestCallChannelCap opens channels up to the per-connection cap: one more is refused with
// ResourceExhausted naming the limit, another connection still opens its own, and closing one
// makes room again.
func TestCallChannelCap(t *testing.T) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 16 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Limits: daemon.Limits{MaxCallChannelsPerConn: 3}})
	ctx := context.Background()
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var chs []*net.UnixConn
	for range 3 {
		chs = append(chs, rawChannel(t, c))
	}
	fds := socketPair(t, unix.SOCK_SEQPACKET)
	_, err = openChannel(ctx, c, fds[1])
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "3 call channels open, the limit (max call channels per connection)") {
		t.Errorf("a fourth channel: %v", err)
	}
	other, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	rawChannel(t, other)
	_ = chs[0].Close()
	waitFor(t, "the closed channel to go", func() bool { return channelsGauge(t, r) == 3 })
	if _, err := openChannel(ctx, c, fds[1]); err != nil {
		t.Errorf("a channel after one closed: %v", err)
	}
}

// TestCallChannelFlood floods the daemon with requests over a channel whose engine never reads
// its replies: the daemon closes that channel once a reply waits past the write timeout, logs
// it, keeps serving other engines (a warm run over another connection), and stays up.
func TestCallChannelFlood(t *testing.T) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 64 << 20}}
	var logs syncBuffer
	r := daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20},
		CallChannelWriteTimeout: 300 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch := rawChannel(t, c)
	// Each request is answered with a NotFound naming a 1000-byte engine name, so replies fill
	// the socket's buffers fast.
	req := mustMarshal(t, &enginepb.RequestRef{Engine: strings.Repeat("n", 200), RequestId: strings.Repeat("r", 800)})
	frame := append(engineapi.AppendCallHeader(nil, engineapi.CallHeader{Method: enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REQUEST_RESET, CallID: 1}), req...)
	done := make(chan error, 1)
	go func() {
		_ = ch.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for {
			if _, err := ch.Write(frame); err != nil {
				done <- err
				return
			}
		}
	}()
	// Meanwhile another engine runs, over its own channels.
	e := arenaEngine(t, r.Info.Socket, "bystander", prompts(8, 4, 16, "b"))
	res, err := e.Run(ctx, prompts(8, 4, 16, "b2"), 0)
	if err != nil || res.Requests != 4 {
		t.Errorf("another engine during the flood: %+v, %v", res, err)
	}
	select {
	case err := <-done:
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the daemon did not close the flooding channel in 20 s")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the flood never ended")
	}
	waitFor(t, "the flooding channel to be counted closed", func() bool { return channelsGauge(t, r) <= float64(len(openChannelsOf(e))) })
	if !strings.Contains(logs.String(), "closed a call channel whose engine does not read its replies") {
		t.Errorf("no warning logged; logs:\n%s", logs.String())
	}
	if _, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "x"}); status.Code(err) != codes.NotFound {
		t.Errorf("the flooding engine's gRPC connection afterwards: %v", err)
	}
}

// openChannelsOf lists e's rank 0 call channel pool, when it has one.
func openChannelsOf(e *enginesim.Engine) []struct{} {
	p := e.Client(0).CallChannels()
	if p == nil {
		return nil
	}
	opened, _ := p.Stats()
	return make([]struct{}, opened)
}

// TestCallChannelPeerVanishes closes the engine's end of a channel right after sending a
// StartLoad on it, before reading the reply: the daemon closes its end, the gauge drops, and the
// engine's next run (its loads checked byte for byte) works over its other channels.
func TestCallChannelPeerVanishes(t *testing.T) { eachCallPoll(t, testCallChannelPeerVanishes) }

func testCallChannelPeerVanishes(t *testing.T, poll time.Duration) {
	r := startPolling(t, 64<<20, poll)
	ctx := context.Background()
	reqs := prompts(44, 6, 16, "v")
	e := arenaEngine(t, r.Info.Socket, "vanish", reqs)
	c := e.Client(0)
	base := channelsGauge(t, r)
	ch := rawChannel(t, c)
	sendMsg(t, ch, enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_START_LOAD, 1, mustMarshal(t, &enginepb.EngineRef{Engine: "vanish/rank0"}))
	_ = ch.Close()
	waitFor(t, "the vanished channel to close", func() bool { return channelsGauge(t, r) == base })
	warmRun(ctx, t, e, reqs, "-again", "warm run after a channel vanished")
}

// FuzzCallChannel feeds arbitrary frames to a live call channel of a real daemon. The input is
// a sequence of frames, each a 2-byte little-endian length and that many bytes (at most 64 frames,
// each at most a little over MaxCallFrameBytes). After them a good call is sent (twice if the
// first only closed a message left open): it must be answered, every reply before it must be a
// well-formed response, and the daemon must not panic. A zero-length frame is left out: the
// socket reports it as the end of the channel.
func FuzzCallChannel(f *testing.F) {
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 16 << 20}}
	r := daemontest.Start(f, daemon.Config{Pool: popts})
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = c.Close() })
	ch := rawChannel(f, c)
	const sentinel = ^uint64(0)
	reset := enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REQUEST_RESET
	good := append(engineapi.AppendCallHeader(nil, engineapi.CallHeader{Method: reset, CallID: sentinel}), mustMarshal(f, &enginepb.RequestRef{Engine: "x"})...)
	good2 := append(engineapi.AppendCallHeader(nil, engineapi.CallHeader{Method: reset, CallID: sentinel - 1}), mustMarshal(f, &enginepb.RequestRef{Engine: "x"})...)
	seed := func(frames ...[]byte) []byte {
		var b []byte
		for _, fr := range frames {
			b = binary.LittleEndian.AppendUint16(b, uint16(len(fr)))
			b = append(b, fr...)
		}
		return b
	}
	hdr := func(m enginepb.CallChannelMethod, flags uint8, id uint64) []byte {
		return engineapi.AppendCallHeader(nil, engineapi.CallHeader{Method: m, Flags: flags, CallID: id})
	}
	f.Add(seed(hdr(reset, 0, 1)))
	f.Add(seed([]byte{1, 2, 3}))
	f.Add(seed(hdr(reset, engineapi.CallFrameMore, 2), hdr(reset, engineapi.CallFrameMore, 2), hdr(3, 0, 2)))
	f.Add(seed(append(hdr(enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP, 0, 4), 0x0a, 0x05, 'x')))
	f.Add(seed(hdr(777, 0, 5), hdr(reset, 0x80, 6)))
	f.Fuzz(func(t *testing.T, in []byte) {
		for frames := 0; len(in) >= 2 && frames < 64; frames++ {
			n := min(int(binary.LittleEndian.Uint16(in)), len(in)-2)
			frame := append([]byte(nil), in[2:2+n]...)
			in = in[2+n:]
			if len(frame) == 0 {
				continue
			}
			if len(frame) >= engineapi.CallFrameHeaderBytes && binary.LittleEndian.Uint64(frame[8:]) >= sentinel-1 {
				frame[8] = 0
			}
			_ = ch.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := ch.Write(frame); err != nil {
				t.Fatalf("write frame: %v", err)
			}
		}
		// Two good calls: the first may only end a message the frames left open (and be dropped
		// with it); the second is answered whatever came before, and replies come in order.
		for _, g := range [][]byte{good, good2} {
			_ = ch.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := ch.Write(g); err != nil {
				t.Fatalf("write a good call: %v", err)
			}
		}
		asm := engineapi.NewCallAssembler(engineapi.MaxMessageBytes)
		buf := make([]byte, engineapi.MaxCallFrameBytes+1)
		_ = ch.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			n, err := ch.Read(buf)
			if err != nil {
				t.Fatalf("no answer to the good call: %v", err)
			}
			msg, _, err := asm.Add(buf[:n])
			if err != nil {
				t.Fatalf("a malformed reply: %v", err)
			}
			if msg == nil {
				continue
			}
			if msg.Header.CallID >= sentinel-1 && codes.Code(msg.Header.Status) != codes.NotFound {
				t.Fatalf("good call %d: %v %q", msg.Header.CallID, codes.Code(msg.Header.Status), msg.Body)
			}
			if msg.Header.CallID == sentinel-1 {
				return
			}
			if msg.Header.Status == 0 {
				// No engine is registered: no call can succeed.
				t.Fatalf("call %d (method %d) answered OK", msg.Header.CallID, msg.Header.Method)
			}
		}
	})
}

// TestCallChannelVanishesMidStartLoad binds a pass's loads and starts them over a call channel of
// the engine's own connection, then closes the channel without reading a reply, so the daemon's
// StartLoad runs (or is about to run) real loads from the pool when the channel goes. The
// daemon closes the channel and cancels that call, keeps serving (the engine's other calls,
// then a fresh engine whose every loaded byte is checked), and stops cleanly at the end of the
// test (daemontest fails it otherwise).
func TestCallChannelVanishesMidStartLoad(t *testing.T) {
	eachCallPoll(t, testCallChannelVanishesMidStartLoad)
}

func testCallChannelVanishesMidStartLoad(t *testing.T, poll time.Duration) {
	r := startPolling(t, 64<<20, poll)
	ctx := context.Background()
	reqs := prompts(45, 6, 16, "m")
	arenaEngine(t, r.Info.Socket, "mfill", reqs)
	base := channelsGauge(t, r)
	var e *enginesim.Engine
	fired := false
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "mid", TokensPerBlock: 16, Slots: 128,
		AfterBuild: func(meta *enginepb.Metadata) {
			if fired || len(meta.GetLoads()) == 0 {
				return
			}
			fired = true
			ch := rawChannel(t, e.Client(0))
			sendMsg(t, ch, enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_BIND_META, 1, mustMarshal(t, &enginepb.BindMetaRequest{Engine: "mid/rank0", Metadata: meta}))
			sendMsg(t, ch, enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_START_LOAD, 2, mustMarshal(t, &enginepb.EngineRef{Engine: "mid/rank0"}))
			_ = ch.Close()
		}}
	var err error
	if e, err = enginesim.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	// The engine's own run goes on after the hook; its outcome depends on how far the daemon got
	// with the abandoned StartLoad, so it is not checked, only that the daemon survives it.
	_, runErr := e.Run(ctx, renamed(reqs, "-mid"), 0)
	t.Logf("the engine's run after its channel vanished: %v", runErr)
	if !fired {
		t.Fatal("no pass had loads: the hook never ran")
	}
	waitFor(t, "the vanished channel to close", func() bool {
		opened, _ := e.Client(0).CallChannels().Stats()
		return channelsGauge(t, r) <= base+float64(opened)
	})
	if _, err := e.Client(0).RequestReset(ctx, &enginepb.RequestRef{Engine: "mid/rank0", RequestId: "none"}); err != nil {
		t.Errorf("the engine's connection after the channel vanished: %v", err)
	}
	fresh := arenaEngine(t, r.Info.Socket, "fresh", nil)
	warmRun(ctx, t, fresh, reqs, "-fresh", "a fresh engine after the vanished StartLoad")
}

// TestCallChannelLimitsValidated pins the call channel limits' defaults and refuses values New
// must not run with: negative ones, and a request bound above the engine API's message limit.
func TestCallChannelLimitsValidated(t *testing.T) {
	def := daemon.DefaultLimits()
	if def.MaxCallChannelsPerConn != 16 || def.MaxCallRequestBytes != 4<<20 {
		t.Errorf("defaults: %d channels per connection, %d request bytes; want 16 and 4 MiB", def.MaxCallChannelsPerConn, def.MaxCallRequestBytes)
	}
	for _, tc := range []struct {
		limits daemon.Limits
		msg    string
	}{
		{daemon.Limits{MaxCallChannelsPerConn: -1}, "max call channels per connection is negative (-1)"},
		{daemon.Limits{MaxCallRequestBytes: -5}, "max call request bytes is negative (-5)"},
		{daemon.Limits{MaxCallRequestBytes: engineapi.MaxMessageBytes + 1}, "max call request bytes 67108865 is above the engine API's message limit of 67108864"},
	} {
		_, err := daemon.New(daemon.Config{Socket: "unused", Limits: tc.limits, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%+v: %v, want an error naming %q", tc.limits, err, tc.msg)
		}
	}
}

// TestCallChannelDraining: while the daemon drains, a call over a channel is refused with
// Unavailable and the same message as the same call over gRPC, and counted as its error.
func TestCallChannelDraining(t *testing.T) {
	r := start(t, 16<<20)
	ctx := context.Background()
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch := rawChannel(t, c)
	unavailable := func() float64 {
		v, _ := value(scrape(t, "http://"+r.Info.AdminAddr), "kvctl_engine_call_errors_total", map[string]string{"method": "RequestReset", "code": "Unavailable"})
		return v
	}
	before := unavailable()
	daemon.SetDraining(r.Daemon, true)
	ref := &enginepb.RequestRef{Engine: "x"}
	_, gerr := c.RequestReset(ctx, ref)
	var out enginepb.Empty
	cerr := chanCall(t, ch, enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REQUEST_RESET, 1, ref, &out)
	daemon.SetDraining(r.Daemon, false)
	if status.Code(cerr) != codes.Unavailable || !strings.Contains(cerr.Error(), "kvctl serve is shutting down") {
		t.Errorf("a channel call while draining: %v", cerr)
	}
	sameStatus(t, "while draining", gerr, cerr)
	if got := unavailable() - before; got != 2 {
		t.Errorf("kvctl_engine_call_errors_total{RequestReset,Unavailable} grew by %v, want 2", got)
	}
}

// eachCallPoll runs test with the call channels' readers sleeping until each request comes and
// polling for it (Config.CallChannelPoll), whatever the host's CPUs would pick.
func eachCallPoll(t *testing.T, test func(*testing.T, time.Duration)) {
	for _, poll := range []time.Duration{-1, 2 * time.Millisecond} {
		t.Run(fmt.Sprintf("poll=%v", max(poll, 0)), func(t *testing.T) { test(t, poll) })
	}
}

// startPolling is start with the call channels' poll window set.
func startPolling(t *testing.T, poolBytes int64, poll time.Duration) *daemontest.Running {
	t.Helper()
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: poolBytes}}
	return daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20}, CallChannelPoll: poll})
}

// TestCallChannelBurst sends a burst of requests on one channel without reading a reply, some
// in one frame and some in several, each naming its own engine: the daemon answers every one
// in order with its own request's content, though it reads the next request while the call
// before it runs.
func TestCallChannelBurst(t *testing.T) {
	r := startPolling(t, 16<<20, -1)
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch := rawChannel(t, c)
	reset := enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REQUEST_RESET
	const n = 48
	name := func(i int) string { return fmt.Sprintf("burst-engine-%03d", i) }
	msgs := make([][]byte, n)
	for i := range msgs {
		ref := &enginepb.RequestRef{Engine: name(i), RequestId: "r"}
		if i%3 == 0 {
			// Over several frames: the body is joined in the assembler's buffer.
			ref.RequestId = strings.Repeat(fmt.Sprint(i%10), 3*engineapi.MaxCallFrameBytes)
		}
		msgs[i] = mustMarshal(t, ref)
	}
	sent := make(chan error, 1)
	go func() {
		_ = ch.SetWriteDeadline(time.Now().Add(20 * time.Second))
		var err error
		for i, m := range msgs {
			if _, err = engineapi.AppendCallFrames(nil, engineapi.CallHeader{Method: reset, CallID: uint64(1000 + i)}, m, func(f []byte) error {
				_, werr := ch.Write(f)
				return werr
			}); err != nil {
				break
			}
		}
		sent <- err
	}()
	for i := range n {
		h, body := readReply(t, ch)
		if h.CallID != uint64(1000+i) || codes.Code(h.Status) != codes.NotFound || !strings.Contains(string(body), name(i)) {
			t.Fatalf("reply %d: call %d, %v %.200q; want call %d, NotFound naming %s", i, h.CallID, codes.Code(h.Status), body, 1000+i, name(i))
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}
