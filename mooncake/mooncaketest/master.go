package mooncaketest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// MooncakeVersion is the Mooncake release the interop tests are proven against: the PyPI
// wheel mooncake-transfer-engine-non-cuda pinned in tools/python/requirements.txt.
const MooncakeVersion = "0.3.13.post1"

// PyEnv returns the Python environment that holds the real Mooncake (KVCTL_PYENV, built by
// `make pyenv`). When it is missing the test is skipped, or fails when CI=true. Shared libraries
// `make pyenv` unpacked into it for a system that lacks them (tools/python/syslibs.sh) are put
// on this process's LD_LIBRARY_PATH, so the master and Python clients the tests start find them.
func PyEnv(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KVCTL_PYENV")
	if dir == "" {
		unavailable(t, "KVCTL_PYENV is not set")
		return ""
	}
	for _, p := range []string{"bin/python3", "bin/mooncake_master"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			unavailable(t, fmt.Sprintf("%s has no %s", dir, p))
			return ""
		}
	}
	addSysLibs(dir)
	return dir
}

var sysLibsOnce sync.Once

// addSysLibs puts env's syslib/lib, when it exists, first on LD_LIBRARY_PATH (once a process).
func addSysLibs(env string) {
	sysLibsOnce.Do(func() {
		lib := filepath.Join(env, "syslib", "lib")
		if _, err := os.Stat(lib); err != nil {
			return
		}
		cur := os.Getenv("LD_LIBRARY_PATH")
		for _, p := range filepath.SplitList(cur) {
			if p == lib {
				return
			}
		}
		if cur != "" {
			lib += string(os.PathListSeparator) + cur
		}
		_ = os.Setenv("LD_LIBRARY_PATH", lib)
	})
}

// missingLibrary returns the dynamic loader's complaint in a master's log when it could not
// load a shared library ("error while loading shared libraries: ..."), or "".
func missingLibrary(log string) string {
	for _, line := range strings.Split(log, "\n") {
		if i := strings.Index(line, "error while loading shared libraries"); i >= 0 {
			return strings.TrimSpace(line[i:])
		}
	}
	return ""
}

func unavailable(t testing.TB, why string) {
	t.Helper()
	msg := "the real Mooncake master is not available (" + why + "): run `make pyenv`, or `make test`, which builds it"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// MasterOptions are the mooncake_master flags a test may set; zero values keep the
// master's defaults.
type MasterOptions struct {
	// LeaseTTL is --default_kv_lease_ttl.
	LeaseTTL time.Duration
	// SoftPinTTL is --default_kv_soft_pin_ttl and MaxSoftPinTTL --max_kv_soft_pin_ttl.
	SoftPinTTL    time.Duration
	MaxSoftPinTTL time.Duration
	// HighWatermark is --eviction_high_watermark_ratio and EvictionRatio --eviction_ratio.
	HighWatermark float64
	EvictionRatio float64
	// ClientTTL is --client_ttl: how long a segment owner may go without a heartbeat.
	ClientTTL time.Duration
	// Args are further flags, passed as given.
	Args []string
}

// Master is a real mooncake_master process on loopback. Its ports stay the same across
// Kill and Restart, so clients can reconnect to the same addresses.
type Master struct {
	// RPCAddr is the coro_rpc address (host:port) the store clients speak to.
	RPCAddr string
	// MetadataURL is the HTTP metadata server's endpoint, as store clients are given it
	// ("http://127.0.0.1:PORT/metadata").
	MetadataURL string
	// AdminURL is the metrics and admin HTTP server ("http://127.0.0.1:PORT").
	AdminURL string

	t     testing.TB
	bin   string
	args  []string
	ports []int // the RPC, metadata and admin ports args name
	log   *lockedBuffer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartMaster starts a real mooncake_master on free loopback ports and waits until its RPC
// port, metadata server and admin server answer. The process is killed by t.Cleanup and its
// log is written to the test log when the test failed.
func StartMaster(t testing.TB, opts MasterOptions) *Master {
	t.Helper()
	env := PyEnv(t)
	m := &Master{t: t, bin: filepath.Join(env, "bin", "mooncake_master"), log: &lockedBuffer{}}
	t.Cleanup(func() {
		m.Kill()
		if t.Failed() {
			t.Logf("mooncake_master log:\n%s", m.Log())
		}
	})
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		ports, err := freePorts(t.Context(), 3)
		if err != nil {
			t.Fatalf("free ports: %v", err)
		}
		m.RPCAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
		m.MetadataURL = fmt.Sprintf("http://127.0.0.1:%d/metadata", ports[1])
		m.AdminURL = fmt.Sprintf("http://127.0.0.1:%d", ports[2])
		m.ports = ports
		m.args = append([]string{
			"--rpc_address=127.0.0.1",
			"--rpc_port=" + strconv.Itoa(ports[0]),
			"--enable_http_metadata_server=true",
			"--http_metadata_server_host=127.0.0.1",
			"--http_metadata_server_port=" + strconv.Itoa(ports[1]),
			"--metrics_host=127.0.0.1",
			"--metrics_port=" + strconv.Itoa(ports[2]),
			"--rpc_thread_num=" + strconv.Itoa(rpcThreads()),
		}, opts.flags()...)
		if lastErr = m.start(t.Context()); lastErr == nil {
			return m
		}
		m.Kill()
	}
	if lib := missingLibrary(m.Log()); lib != "" {
		unavailable(t, "mooncake_master: "+lib+"; install libibverbs1, librdmacm1 and libnuma1, or let `make pyenv` unpack them")
		return nil
	}
	t.Fatalf("mooncake_master did not start: %v\nlog:\n%s", lastErr, m.Log())
	return nil
}

func (o MasterOptions) flags() []string {
	var f []string
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	if o.LeaseTTL > 0 {
		f = append(f, "--default_kv_lease_ttl="+ms(o.LeaseTTL))
	}
	if o.SoftPinTTL > 0 {
		f = append(f, "--default_kv_soft_pin_ttl="+ms(o.SoftPinTTL))
	}
	if o.MaxSoftPinTTL > 0 {
		f = append(f, "--max_kv_soft_pin_ttl="+ms(o.MaxSoftPinTTL))
	}
	if o.HighWatermark > 0 {
		f = append(f, "--eviction_high_watermark_ratio="+strconv.FormatFloat(o.HighWatermark, 'f', -1, 64))
	}
	if o.EvictionRatio > 0 {
		f = append(f, "--eviction_ratio="+strconv.FormatFloat(o.EvictionRatio, 'f', -1, 64))
	}
	if o.ClientTTL > 0 {
		f = append(f, "--client_ttl="+strconv.FormatInt(int64(o.ClientTTL/time.Second), 10))
	}
	return append(f, o.Args...)
}

// start starts the process and waits, within ctx, until it serves. ctx does not bound the
// process: Kill ends it, from t.Cleanup, once the cleanups registered after StartMaster (a
// client unmounting its segment, say) have run, which is after t.Context() is done.
func (m *Master) start(ctx context.Context) error {
	cmd := exec.Command(m.bin, m.args...) //nolint:noctx // the process outlives the start's ctx; Kill ends it (see above)
	fmt.Fprintf(m.log, "=== start %s %s\n", m.bin, strings.Join(m.args, " "))
	cmd.Stdout = m.log
	cmd.Stderr = m.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	return m.waitReady(ctx, cmd.Process.Pid, done, 30*time.Second)
}

func (m *Master) waitReady(ctx context.Context, pid int, done <-chan struct{}, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	hc := &http.Client{Timeout: time.Second}
	dialer := net.Dialer{Timeout: 200 * time.Millisecond}
	var foreign []int
	for time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-done:
			// The master may fail to bind and exit before any probe round saw the port
			// taken: with the master gone, whoever listens on its ports is another process.
			if held, err := listenedOn(m.ports); err == nil && len(held) > 0 {
				foreign = held
			}
			if len(foreign) > 0 {
				return fmt.Errorf("mooncake_master exited during start-up; another process listened on its port(s) %v", foreign)
			}
			return errors.New("mooncake_master exited during start-up")
		default:
		}
		if c, err := dialer.DialContext(ctx, "tcp", m.RPCAddr); err == nil {
			_ = c.Close()
			if httpOK(ctx, hc, m.AdminURL+"/health") && httpAnswers(ctx, hc, m.MetadataURL+"?key=kvctl-ready-probe") {
				// The probes prove that something answers on the three ports, not that it is
				// this master: another process may take a port between freePorts and the
				// master's bind. The master then fails to start that server and exits, which
				// the next round sees. Ready only once this process holds all three listeners.
				var err error
				if foreign, err = notListening(pid, m.ports); err != nil {
					return err
				}
				if len(foreign) == 0 {
					return nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mooncake_master start: %w", err)
	}
	if len(foreign) > 0 {
		return fmt.Errorf("mooncake_master not ready after %v: another process listens on its port(s) %v", limit, foreign)
	}
	return fmt.Errorf("mooncake_master not ready after %v", limit)
}

// httpOK says whether a GET of url answers 200.
func httpOK(ctx context.Context, hc *http.Client, url string) bool {
	code, ok := httpGet(ctx, hc, url)
	return ok && code == http.StatusOK
}

// httpAnswers says whether a GET of url answers at all.
func httpAnswers(ctx context.Context, hc *http.Client, url string) bool {
	_, ok := httpGet(ctx, hc, url)
	return ok
}

func httpGet(ctx context.Context, hc *http.Client, url string) (int, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false
	}
	_ = resp.Body.Close()
	return resp.StatusCode, true
}

// Kill stops the master with SIGKILL and waits for it to exit; it is a no-op when the master
// is not running.
func (m *Master) Kill() {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
	fmt.Fprintf(m.log, "=== killed\n")
}

// Restart kills the master (when running) and starts it again on the same ports, with an
// empty store, as a master restarted without HA comes back.
func (m *Master) Restart() {
	m.t.Helper()
	m.Kill()
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = m.start(m.t.Context()); err == nil {
			return
		}
		m.Kill()
		time.Sleep(250 * time.Millisecond)
	}
	m.t.Fatalf("mooncake_master did not restart: %v\nlog:\n%s", err, m.Log())
}

// Log returns what the master has written to stdout and stderr so far, across restarts.
func (m *Master) Log() string { return m.log.String() }

// Metric reads one unlabelled sample from the master's /metrics; ok is false when it is not
// exposed.
func (m *Master) Metric(ctx context.Context, name string) (value float64, ok bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.AdminURL+"/metrics", nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return 0, false, err
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil, err
		}
	}
	return 0, false, nil
}

// freePorts reserves n distinct free loopback TCP ports by binding and releasing them.
func freePorts(ctx context.Context, n int) ([]int, error) {
	var lc net.ListenConfig
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePorts(t.Context(), 1)
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return p[0]
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Bounded: a chatty process must not grow the test's memory without limit.
	if b.buf.Len() > 8<<20 {
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// rpcThreads is the master's RPC thread count here: Mooncake's own default, min(4, cores), so
// a many-core host's cluster benchmarks meet the master as deployed, and a two-core one's tests
// the two threads they always had.
func rpcThreads() int { return min(4, runtime.NumCPU()) }
