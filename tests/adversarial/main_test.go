package adversarial

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// kvctl is the binary under test, built by TestMain.
var kvctl string

// nobodyUID is the second user the cross-user attacks run as.
const nobodyUID = 65534

func TestMain(m *testing.M) {
	if role := os.Getenv("ADVERSARIAL_ROLE"); role != "" {
		os.Exit(runRole(role))
	}
	dir, err := os.MkdirTemp("", "kvadv")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Readable by the second uid, which runs the binary in the cross-user tests.
	_ = os.Chmod(dir, 0o755)
	kvctl = filepath.Join(dir, "kvctl")
	build := exec.Command("go", "build", "-o", kvctl, "github.com/kvctl/kvctl/cmd/kvctl")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building kvctl:", err)
		os.Exit(1)
	}
	self, err := os.Executable()
	if err == nil {
		// The flooders re-run this test binary, possibly as the second uid.
		if data, err := os.ReadFile(self); err == nil {
			selfCopy = filepath.Join(dir, "adversarial.test")
			_ = os.WriteFile(selfCopy, data, 0o755)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// selfCopy is a world-readable copy of this test binary, for flooders run as another uid.
var selfCopy string

// lockedBuffer collects a process's stderr while tests read it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) write(s string) {
	l.mu.Lock()
	l.b.WriteString(s)
	l.mu.Unlock()
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serveProc is a running `kvctl serve`.
type serveProc struct {
	cmd    *exec.Cmd
	socket string
	admin  string
	stderr *lockedBuffer
	done   chan struct{}
	err    error
}

type serveOpts struct {
	args []string
	uid  int // run as this uid when > 0
	dir  string
}

// socketDir makes a fresh 0700 directory for sockets, short enough for a unix socket path.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// startServe starts kvctl serve on a fresh socket and waits for its banner.
func startServe(t *testing.T, o serveOpts) *serveProc {
	t.Helper()
	dir := o.dir
	if dir == "" {
		dir = socketDir(t)
	}
	p, err := launchServe(t, filepath.Join(dir, "kvctl.sock"), o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func launchServe(t *testing.T, socket string, o serveOpts) (*serveProc, error) {
	t.Helper()
	args := append([]string{"serve", "--socket", socket, "--admin-addr", "127.0.0.1:0", "--pool-size", "64MiB"}, o.args...)
	cmd := exec.Command(kvctl, args...)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir(), "NO_COLOR=1")
	if o.uid > 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(o.uid), Gid: uint32(o.uid)}}
		// A config directory the other uid can look into (absent, so no config is read).
		cmd.Env = append(cmd.Env, "HOME=/tmp", "XDG_CONFIG_HOME=/tmp/kvctl-adversarial-no-config")
	}
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	p := &serveProc{cmd: cmd, socket: socket, stderr: &lockedBuffer{}, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.write(line + "\n")
			if addr, ok := strings.CutPrefix(strings.TrimSpace(line), "admin    http://"); ok {
				ready <- addr
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() { p.err = cmd.Wait(); _ = pw.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	select {
	case p.admin = <-ready:
		return p, nil
	case <-p.done:
		return p, fmt.Errorf("kvctl serve exited before it was ready: %w\n%s", p.err, p.stderr)
	case <-time.After(30 * time.Second):
		return p, fmt.Errorf("kvctl serve was not ready in 30s:\n%s", p.stderr)
	}
}

// alive fails the test if the daemon has exited.
func (p *serveProc) alive(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("kvctl serve exited: %v\n%s", p.err, tail(p.stderr.String(), 40))
	default:
	}
}

// healthy checks the daemon is alive and its admin API answers /healthz.
func (p *serveProc) healthy(t *testing.T) {
	t.Helper()
	p.alive(t)
	c := &http.Client{Timeout: 10 * time.Second}
	var lastErr error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := c.Get("http://" + p.admin + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		lastErr = err
	}
	t.Fatalf("admin /healthz: %v", lastErr)
}

// rss and fds of a process, from /proc.
func procStats(pid int) (rssKiB int64, fds int, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			rssKiB, _ = strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return rssKiB, 0, err
	}
	return rssKiB, len(ents), nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as a second uid (nobody); run the adversarial tests as root in CI")
	}
}

// runAs runs this test binary in a flood role, as uid when uid > 0, and returns its output.
func runAs(ctx context.Context, uid int, role string, env ...string) *exec.Cmd {
	bin := selfCopy
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), append([]string{"ADVERSARIAL_ROLE=" + role}, env...)...)
	if uid > 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	return cmd
}

var errRole = errors.New("unknown role")
