package transfer_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/mooncake/transfer"
)

// The test binary doubles as a standalone kvctl transfer server so that benchmarks and interop
// tests cross a process boundary: with serveEnv set, TestMain runs serveChild instead of tests.
const serveEnv = "KVCTL_TRANSFER_TEST_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) != "" {
		os.Exit(serveChild())
	}
	os.Exit(m.Run())
}

// childBase is where the child server registers its buffer.
const childBase = 0x7f0000000000

// serveChild serves one buffer of $KVCTL_TRANSFER_TEST_SIZE bytes (filled with i*7 mod 251)
// at childBase, prints {"addr": ...} and runs until stdin closes. With
// $KVCTL_TRANSFER_TEST_META and $KVCTL_TRANSFER_TEST_NAME it publishes its segment there.
func serveChild() int {
	size, err := strconv.Atoi(os.Getenv("KVCTL_TRANSFER_TEST_SIZE"))
	if err != nil || size <= 0 {
		fmt.Fprintln(os.Stderr, "serve child: bad size", err)
		return 1
	}
	srv, err := transfer.NewServer(transfer.ServerOptions{Addr: "127.0.0.1:0"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve child:", err)
		return 1
	}
	mem := make([]byte, size)
	for i := range mem {
		mem[i] = byte(i * 7 % 251)
	}
	if err := srv.Register(childBase, mem); err != nil {
		fmt.Fprintln(os.Stderr, "serve child:", err)
		return 1
	}
	go func() { _ = srv.Serve() }()
	name := os.Getenv("KVCTL_TRANSFER_TEST_NAME")
	var meta *transfer.MetadataClient
	if u := os.Getenv("KVCTL_TRANSFER_TEST_META"); u != "" && name != "" {
		meta, err = transfer.NewMetadataClient(u, transfer.MetadataOptions{})
		if err == nil {
			err = meta.PublishSegment(context.Background(), transfer.SegmentDesc{
				Name: name, Protocol: transfer.ProtocolTCP, TCPDataPort: srv.Port(),
				Buffers: []transfer.BufferDesc{{Name: name, Addr: childBase, Length: uint64(size)}},
			}, "127.0.0.1", srv.Port())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "serve child:", err)
			return 1
		}
	}
	out, _ := json.Marshal(map[string]any{"addr": srv.Addr().String(), "base": childBase})
	fmt.Println(string(out))
	_, _ = io.Copy(io.Discard, os.Stdin)
	if meta != nil {
		_ = meta.RemoveSegment(context.Background(), name)
	}
	_ = srv.Close()
	return 0
}

// startChildServer runs the test binary as a kvctl transfer server in its own process.
func startChildServer(tb testing.TB, size int, metaURL, name string) (addr string, pid int) {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), serveEnv+"=1", "KVCTL_TRANSFER_TEST_SIZE="+strconv.Itoa(size),
		"KVCTL_TRANSFER_TEST_META="+metaURL, "KVCTL_TRANSFER_TEST_NAME="+name)
	p := startProc(tb, cmd)
	line := p.line(tb)
	var hello struct{ Addr string }
	if err := json.Unmarshal([]byte(line), &hello); err != nil || hello.Addr == "" {
		tb.Fatalf("child server said %q: %v", line, err)
	}
	return hello.Addr, cmd.Process.Pid
}

// procCPU returns the user+system CPU time a process has used so far, from /proc.
func procCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / clkTck
}

// lineProc is a child process spoken to in JSON lines.
type lineProc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	errLn *strings.Builder
}

// startProc starts cmd in its own process group and kills the group in Cleanup.
func startProc(tb testing.TB, cmd *exec.Cmd) *lineProc {
	tb.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	outR, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var errLog strings.Builder
	cmd.Stderr = &limitedWriter{b: &errLog, n: 64 << 10}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	sc := bufio.NewScanner(outR)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	return &lineProc{cmd: cmd, in: in, out: sc, errLn: &errLog}
}

func (p *lineProc) line(tb testing.TB) string {
	tb.Helper()
	got := make(chan bool, 1)
	go func() { got <- p.out.Scan() }()
	select {
	case ok := <-got:
		if !ok {
			tb.Fatalf("%s exited before answering (%v); stderr:\n%s", p.cmd.Path, p.out.Err(), tail(p.errLn.String()))
		}
	case <-time.After(60 * time.Second):
		tb.Fatalf("%s did not answer within 60s; stderr:\n%s", p.cmd.Path, tail(p.errLn.String()))
	}
	return p.out.Text()
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}

type limitedWriter struct {
	b *strings.Builder
	n int
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if room := w.n - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// pyenv returns the Python environment with the pinned Mooncake wheel, skipping (or failing
// under CI=true) when it is absent.
func pyenv(tb testing.TB) string { return mooncaketest.PyEnv(tb) }

// startMaster starts a real mooncake_master on free loopback ports and returns its HTTP
// metadata server's URL.
func startMaster(tb testing.TB) string {
	return mooncaketest.StartMaster(tb, mooncaketest.MasterOptions{}).MetadataURL
}

// pyPeer is a real Mooncake TransferEngine (Python, TCP) owning one registered buffer.
type pyPeer struct {
	*lineProc
	Name string
	Base uint64
	Size int
}

// startPyPeer starts testdata/te_peer.py as segment name with a buffer of size bytes.
// extraEnv is added to the engine's environment (for example MC_TCP_PROTO=1).
func startPyPeer(tb testing.TB, metaURL, name string, size int, extraEnv ...string) *pyPeer {
	tb.Helper()
	env := pyenv(tb)
	cmd := exec.Command(filepath.Join(env, "bin", "python"), filepath.Join("testdata", "te_peer.py"), name, metaURL, strconv.Itoa(size))
	cmd.Env = append(append(os.Environ(), "MC_TCP_BIND_ADDRESS=127.0.0.1", "GLOG_minloglevel=1"), extraEnv...)
	p := startProc(tb, cmd)
	var hello struct {
		Name  string
		Base  uint64
		Size  int
		Error string
	}
	line := p.line(tb)
	if err := json.Unmarshal([]byte(line), &hello); err != nil || hello.Error != "" || hello.Base == 0 {
		tb.Fatalf("python peer said %q (%v); stderr:\n%s", line, err, tail(p.errLn.String()))
	}
	return &pyPeer{lineProc: p, Name: name, Base: hello.Base, Size: hello.Size}
}

func (p *pyPeer) call(tb testing.TB, cmd map[string]any) map[string]any {
	tb.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		tb.Fatalf("python peer: %v; stderr:\n%s", err, tail(p.errLn.String()))
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(p.line(tb)), &out); err != nil {
		tb.Fatal(err)
	}
	if e, ok := out["error"]; ok {
		tb.Fatalf("python peer: %v", e)
	}
	return out
}

func (p *pyPeer) fill(tb testing.TB, off int, data []byte) {
	p.call(tb, map[string]any{"op": "fill", "off": off, "data": base64.StdEncoding.EncodeToString(data)})
}

func (p *pyPeer) dump(tb testing.TB, off, n int) []byte {
	out := p.call(tb, map[string]any{"op": "dump", "off": off, "len": n})
	b, err := base64.StdEncoding.DecodeString(out["data"].(string))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// transfer makes the Python engine read ("read") or write ("write") n bytes between its own
// buffer at off and segment target's address addr; it returns the engine's return code.
func (p *pyPeer) transfer(tb testing.TB, op, target string, off int, addr uint64, n int) int {
	out := p.call(tb, map[string]any{"op": op, "target": target, "off": off, "addr": addr, "len": n})
	return int(out["rc"].(float64))
}
