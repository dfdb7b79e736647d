package adversarial

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/engineapi"
)

// plant is the planted daemon of attack 1, run as another user: it listens where an engine
// expects kvctl serve (creating dir first when given, or on the bound socket it inherited as
// descriptor 3), takes every descriptor sent to its side channel and answers with a token, as
// the real daemon would, and holds engine connections without answering. It prints "ready",
// then one "received" line for each descriptor, and stops after hold.
func plant(dir, socket string, hold time.Duration) int {
	var ls []net.Listener
	if dir != "" {
		if err := os.Mkdir(dir, 0o700); err != nil {
			fmt.Println("error:", err)
			return 1
		}
	}
	if socket != "" {
		for _, path := range []string{socket, engineapi.FDSocketPath(socket)} {
			l, err := net.Listen("unix", path)
			if err != nil {
				fmt.Println("error:", err)
				return 1
			}
			ls = append(ls, l)
		}
	} else {
		// Sockets the victim bound (descriptors 3 and 4); listening on them makes this process
		// their SO_PEERCRED.
		for fd := 3; fd <= 4; fd++ {
			if err := unix.Listen(fd, 16); err != nil {
				fmt.Println("error: listen on the inherited socket:", err)
				return 1
			}
			l, err := net.FileListener(os.NewFile(uintptr(fd), "inherited"))
			if err != nil {
				fmt.Println("error:", err)
				return 1
			}
			ls = append(ls, l)
		}
	}
	var received atomic.Int64
	for _, l := range ls {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					uc := c.(*net.UnixConn)
					oob := make([]byte, unix.CmsgSpace(4))
					_, oobn, _, _, err := uc.ReadMsgUnix(make([]byte, 1), oob)
					if err != nil || oobn == 0 {
						return // an engine connection: held, never answered
					}
					received.Add(1)
					fmt.Println("received")
					_, _ = uc.Write([]byte(strings.Repeat("ab", engineapi.TokenSize)))
				}()
			}
		}()
	}
	fmt.Println("ready")
	time.Sleep(hold)
	fmt.Printf("received=%d\n", received.Load())
	return 0
}

// startPlant runs plant as nobody and waits for it to listen; received counts the descriptors
// it took.
func startPlant(t *testing.T, ctx context.Context, inherited []*os.File, env ...string) (received *atomic.Int64) {
	t.Helper()
	cmd := runAs(ctx, nobodyUID, "plant", append(env, "DURATION=2m")...)
	cmd.ExtraFiles = inherited
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	received = &atomic.Int64{}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			switch line := sc.Text(); {
			case line == "received":
				received.Add(1)
			case line == "ready" || strings.HasPrefix(line, "error"):
				ready <- line
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line := <-ready:
		if line != "ready" {
			t.Fatalf("planting: %s", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the planted daemon did not start")
	}
	return received
}

// writeTrace writes a two-request trace for kvctl replay.
func writeTrace(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	data := `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [1, 3]}
`
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// replayLive runs kvctl replay against the engine socket at socket, bounded by limit, and
// returns its exit code and output; a replay still running at limit is a failure of the test.
func replayLive(t *testing.T, socket string, limit time.Duration) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, kvctl, "replay", "--target", socket, "--pace", "max", writeTrace(t))
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir(), "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("kvctl replay --target %s was still running after %v:\n%s", socket, limit, tail(string(out), 20))
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// TestPlantedDaemon: another user who planted the engine's socket directory with their own
// listeners before kvctl serve started, or who listens on a socket the engine's directory holds,
// never receives the engine's memory descriptor: kvctl replay (a Go engine) refuses before it
// sends anything, saying what was planted. Two real users: the engine is root, the planter
// nobody.
func TestPlantedDaemon(t *testing.T) {
	requireRoot(t)
	t.Run("planted directory", func(t *testing.T) {
		// A shared /tmp-like parent (sticky, world-writable) where nobody creates the victim's
		// directory first.
		parent := socketDir(t)
		if err := os.Chmod(parent, 0o1777); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(parent, fmt.Sprintf("kvctl-%d", os.Getuid()))
		socket := filepath.Join(dir, "kvctl.sock")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		received := startPlant(t, ctx, nil, "DIR="+dir, "SOCKET="+socket)
		code, out := replayLive(t, socket, 90*time.Second)
		if code == 0 || !strings.Contains(out, "owned by uid 65534") || !strings.Contains(out, "planted") {
			t.Errorf("replay against a planted directory: exit %d, want a refusal naming the planter:\n%s", code, tail(out, 10))
		}
		if n := received.Load(); n != 0 {
			t.Errorf("the planted daemon received %d of the engine's descriptors", n)
		}
	})
	t.Run("listener of another uid", func(t *testing.T) {
		// The directory is the engine's own and safe, but the side channel's listener is another
		// user's process (it called listen on a socket it got hold of).
		dir := socketDir(t)
		socket := filepath.Join(dir, "kvctl.sock")
		var bound []*os.File
		for _, path := range []string{socket, engineapi.FDSocketPath(socket)} {
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			if err != nil {
				t.Fatal(err)
			}
			f := os.NewFile(uintptr(fd), "bound")
			defer f.Close()
			if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
				t.Fatal(err)
			}
			bound = append(bound, f)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		received := startPlant(t, ctx, bound)
		code, out := replayLive(t, socket, 90*time.Second)
		if code == 0 || !strings.Contains(out, "of uid 65534") || !strings.Contains(out, "another user's process") {
			t.Errorf("replay against another uid's listener: exit %d, want a refusal naming its uid:\n%s", code, tail(out, 10))
		}
		if n := received.Load(); n != 0 {
			t.Errorf("the other uid's listener received %d of the engine's descriptors", n)
		}
	})
}

// TestSilentDaemon: kvctl replay against a daemon that accepts every connection and never
// answers fails with an error that says the daemon did not answer, instead of hanging until
// SIGINT.
func TestSilentDaemon(t *testing.T) {
	dir := socketDir(t)
	socket := filepath.Join(dir, "kvctl.sock")
	var (
		mu   sync.Mutex
		held []net.Conn
	)
	for _, path := range []string{socket, engineapi.FDSocketPath(socket)} {
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c) // never read, never answered
				mu.Unlock()
			}
		}()
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	code, out := replayLive(t, socket, 2*time.Minute)
	if code == 0 || code == 130 || !strings.Contains(out, "did not answer") {
		t.Errorf("replay against a silent daemon: exit %d, want a failure saying it did not answer:\n%s", code, tail(out, 10))
	}
}
