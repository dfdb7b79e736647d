package engineapi

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// silentListener accepts connections on a unix socket at path and never answers, the daemon of
// attack 7. It counts descriptors that arrive.
func silentListener(t *testing.T, path string) *atomic.Int64 {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() {
				oob := make([]byte, unix.CmsgSpace(4))
				_, oobn, _, _, err := c.ReadMsgUnix(make([]byte, 1), oob)
				if err == nil && oobn > 0 {
					got.Add(1)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return &got
}

func memfd(t *testing.T) int {
	t.Helper()
	fd, err := unix.MemfdCreate("trust", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}

// TestSendFDRefusesUnsafeSockets: a descriptor is never sent to a socket whose directory is a
// symlink or writable by others, or to a path that is not a socket; the error names what was
// found. (Another uid's directory and listener are attacked in tests/adversarial.)
func TestSendFDRefusesUnsafeSockets(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	safe := filepath.Join(base, "safe")
	if err := os.Mkdir(safe, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(safe, link); err != nil {
		t.Fatal(err)
	}
	openGot := silentListener(t, filepath.Join(open, "s.fd"))
	safeGot := silentListener(t, filepath.Join(safe, "s.fd"))
	if err := os.WriteFile(filepath.Join(safe, "file.fd"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fd := memfd(t)
	cases := []struct{ name, path, want string }{
		{"world-writable directory", filepath.Join(open, "s.fd"), "has mode 0777"},
		{"symlinked directory", filepath.Join(link, "s.fd"), "is a symlink"},
		{"not a socket", filepath.Join(safe, "file.fd"), "is not a socket"},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := SendFD(ctx, c.path, fd)
		cancel()
		if !errors.Is(err, ErrUntrustedDaemon) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrUntrustedDaemon saying %q", c.name, err, c.want)
		}
	}
	if n := openGot.Load() + safeGot.Load(); n != 0 {
		t.Errorf("%d descriptors reached a refused socket", n)
	}
}

// TestClientCallsHaveDeadlines: a daemon that accepts and never answers fails SendFD and a gRPC
// call without a deadline in their context, with errors that say so, instead of hanging.
func TestClientCallsHaveDeadlines(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "kvctl.sock")
	silentListener(t, sock)
	got := silentListener(t, FDSocketPath(sock))

	old := callTimeout
	callTimeout = 300 * time.Millisecond
	t.Cleanup(func() { callTimeout = old })

	c, err := Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Lookup(context.Background(), &enginepb.LookupRequest{Engine: "e", Request: &enginepb.Request{Id: "r"}})
		errc <- err
	}()
	select {
	case err := <-errc:
		if code := status.Code(err); code != codes.DeadlineExceeded && code != codes.Unavailable {
			t.Errorf("lookup against a silent daemon: %v, want DeadlineExceeded or Unavailable", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a lookup without a deadline hung on a daemon that never answers")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = SendFD(ctx, FDSocketPath(sock), memfd(t))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not answer in time") {
		t.Errorf("SendFD to a silent side channel: %v, want a deadline error that says the daemon did not answer", err)
	}
	if got.Load() != 1 {
		t.Errorf("the silent side channel got %d descriptors, want 1 (sent before the deadline)", got.Load())
	}
}
