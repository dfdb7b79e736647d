package engineapi

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrUntrustedDaemon is wrapped by the error of every call that would hand a descriptor (engine
// memory, a prompt arena, a call channel) to a socket that may not be kvctl serve's: a socket
// directory or socket another user owns or could have replaced, or a listener whose SO_PEERCRED
// uid is not the daemon's. Nothing is sent in that case.
var ErrUntrustedDaemon = errors.New("untrusted daemon socket")

// DaemonTrust says which uids an engine accepts as the owner of the daemon's socket directory
// and as the listener its descriptors go to. The engine's own effective uid and root (which can
// read any process's memory anyway) are always accepted.
type DaemonTrust struct {
	// DaemonUID is the uid kvctl serve runs as when it is not the engine's own (a daemon shared
	// with engines of other users through --engine-group). 0 adds nothing.
	DaemonUID int
}

func (t DaemonTrust) trusted(uid uint32) bool {
	return uid == 0 || int(uid) == os.Geteuid() || (t.DaemonUID > 0 && int(uid) == t.DaemonUID)
}

func (t DaemonTrust) describe() string {
	if t.DaemonUID > 0 && t.DaemonUID != os.Geteuid() {
		return fmt.Sprintf("this engine's uid %d or the daemon's uid %d", os.Geteuid(), t.DaemonUID)
	}
	return fmt.Sprintf("this engine's uid %d", os.Geteuid())
}

// checkDaemonPath refuses a socket whose directory is a symlink, is owned by an untrusted uid or
// can be written by others, and a socket file that is not a socket or is owned by an untrusted
// uid: another user could have planted either before the daemon started.
func checkDaemonPath(path string, t DaemonTrust) error {
	dir := filepath.Dir(path)
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		dest, _ := os.Readlink(dir)
		return fmt.Errorf("socket directory %s is a symlink to %q, which another user may have planted: %w; refusing to send this engine's memory there", dir, dest, ErrUntrustedDaemon)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return fmt.Errorf("socket directory %s is not a directory: %w", dir, ErrUntrustedDaemon)
	}
	if !t.trusted(st.Uid) {
		return fmt.Errorf("socket directory %s is owned by uid %d, not by %s: another user planted it: %w; refusing to send this engine's memory there (remove it, or name the daemon's uid if it runs as another user)", dir, st.Uid, t.describe(), ErrUntrustedDaemon)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("socket directory %s has mode %04o: others can replace its sockets: %w; refusing to send this engine's memory there (chmod 700 %s)", dir, perm, ErrUntrustedDaemon, dir)
	}
	fi, err = os.Lstat(path)
	if err != nil {
		return fmt.Errorf("descriptor channel %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("descriptor channel %s is not a socket (mode %v): %w", path, fi.Mode(), ErrUntrustedDaemon)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && !t.trusted(st.Uid) {
		return fmt.Errorf("descriptor channel %s is owned by uid %d, not by %s: another user planted it: %w; refusing to send this engine's memory there", path, st.Uid, t.describe(), ErrUntrustedDaemon)
	}
	return nil
}

// checkDaemonPeer refuses a connection whose listener (SO_PEERCRED) is not a trusted uid.
func checkDaemonPeer(uc *net.UnixConn, path string, t DaemonTrust) error {
	raw, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("descriptor channel %s: peer credentials: %w", path, err)
	}
	var cred *unix.Ucred
	cerr := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("descriptor channel %s: peer credentials: %w", path, err)
	}
	if !t.trusted(cred.Uid) {
		return fmt.Errorf("descriptor channel %s is served by pid %d of uid %d, not by %s: another user's process listens there: %w; refusing to send this engine's memory to it", path, cred.Pid, cred.Uid, t.describe(), ErrUntrustedDaemon)
	}
	return nil
}
