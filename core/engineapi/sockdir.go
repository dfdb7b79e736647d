package engineapi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ErrUnsafeSocketDir is wrapped by Listen's error when the socket's directory could let another
// user replace the sockets (and so receive an engine's memory descriptor).
var ErrUnsafeSocketDir = errors.New("unsafe socket directory")

// SocketDirPolicy says which socket directories Listen accepts.
type SocketDirPolicy struct {
	// GroupID, when non-negative, also accepts a directory whose group is GroupID with mode 0750
	// or 0710: the operator shares the sockets with engines running as other users of that
	// group. Negative means only mode 0700 is accepted.
	GroupID int
}

// checkSocketDir refuses a socket directory that is a symlink, is not a directory, is not owned
// by the daemon's uid, or that anyone but the owner (and the operator's group, where one is
// named) can write or enter. Every refusal says what to fix.
func checkSocketDir(dir string, p SocketDirPolicy) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("socket directory %s is a symlink: %w; remove it (another user may have planted it) or pass a --socket in a directory you own", dir, ErrUnsafeSocketDir)
	}
	if !fi.IsDir() {
		return fmt.Errorf("socket directory %s is not a directory: %w", dir, ErrUnsafeSocketDir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("socket directory %s: no owner information: %w", dir, ErrUnsafeSocketDir)
	}
	uid := os.Geteuid()
	if int(st.Uid) != uid {
		return fmt.Errorf("socket directory %s is owned by uid %d, not by this daemon's uid %d: %w; remove it (another user may have created it) or pass a --socket in a directory you own", dir, st.Uid, uid, ErrUnsafeSocketDir)
	}
	perm := fi.Mode().Perm()
	if perm == 0o700 {
		return nil
	}
	if p.GroupID >= 0 && int(st.Gid) == p.GroupID && (perm == 0o750 || perm == 0o710) {
		return nil
	}
	want := "0700"
	if p.GroupID >= 0 {
		want = fmt.Sprintf("0700, or 0750/0710 with group %d", p.GroupID)
	}
	return fmt.Errorf("socket directory %s has mode %04o, want %s: %w; run chmod 700 %s", dir, perm, want, ErrUnsafeSocketDir, dir)
}

// ensureSocketDir creates the socket directory with mode 0700 where it is missing (its parent
// included), then checks it.
func ensureSocketDir(dir string, p SocketDirPolicy) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return fmt.Errorf("socket directory %s: %w", dir, err)
		}
		// Mkdir, not MkdirAll: a directory another user creates in the meantime must fail here
		// or in the check below, never be adopted.
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("socket directory %s: %w", dir, err)
		}
	}
	return checkSocketDir(dir, p)
}

// socketGroup gives the socket at path the group gid. A socket created in a setgid directory of
// that group has it already; otherwise the daemon's user must be a member of the group to chgrp.
func socketGroup(path string, gid int) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Gid) == gid {
		return nil
	}
	if err := os.Lchown(path, -1, gid); err != nil {
		return fmt.Errorf("giving %s the engine group %d: %w; make the daemon's user a member of the group, or set the socket directory's setgid bit (chmod 2750) with that group", path, gid, err)
	}
	return nil
}
