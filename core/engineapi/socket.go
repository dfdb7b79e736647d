package engineapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// DefaultSocketPath is where `kvctl serve` listens unless told otherwise:
// $XDG_RUNTIME_DIR/kvctl/kvctl.sock, else /tmp/kvctl-<uid>/kvctl.sock.
func DefaultSocketPath(getenv func(string) string) string {
	if d := getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "kvctl", "kvctl.sock")
	}
	return filepath.Join(os.TempDir(), "kvctl-"+strconv.Itoa(os.Getuid()), "kvctl.sock")
}

// FDSocketPath is the descriptor side channel that goes with the engine socket at path.
func FDSocketPath(path string) string { return path + ".fd" }

// ErrSocketInUse means another process is serving on the socket path.
var ErrSocketInUse = errors.New("socket in use")

// Listen creates the unix socket at path with mode 0600 in a directory only the owner can enter
// (created with 0700 when missing). A directory that is a symlink, belongs to another uid or
// that others can enter is refused with ErrUnsafeSocketDir. A stale socket left by a dead daemon
// is removed; a live one is refused with ErrSocketInUse. ctx bounds the probe of an existing
// socket.
func Listen(ctx context.Context, path string) (*net.UnixListener, error) {
	return ListenPolicy(ctx, path, SocketDirPolicy{GroupID: -1})
}

// ListenPolicy is Listen with the socket directory checked against p.
func ListenPolicy(ctx context.Context, path string, p SocketDirPolicy) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := ensureSocketDir(dir, p); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket; refusing to replace it", path)
		}
		probe := net.Dialer{Timeout: time.Second}
		c, err := probe.DialContext(ctx, "unix", path)
		if err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("%s: %w: another kvctl serve is listening there", path, ErrSocketInUse)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("%s: probing the existing socket: %w", path, err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
	}
	// The umask decides the mode bind gives the socket; set it narrow for the bind and chmod
	// after, so the socket is never reachable by others, not even briefly.
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	mode := os.FileMode(0o600)
	if p.GroupID >= 0 {
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	if p.GroupID >= 0 {
		if err := socketGroup(path, p.GroupID); err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	l.SetUnlinkOnClose(true)
	return l, nil
}
