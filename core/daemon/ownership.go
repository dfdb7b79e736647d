package daemon

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A registration belongs to the engine connection that made it. Every call that names an engine
// must come over that connection: another process on the socket (even of the same user) that
// learns or guesses the name cannot bind metadata to it, load into or save from its memory, or
// unregister it.

// ownedBy refuses a call that came over another connection than the registration's.
func (e *engine) ownedBy(conn uint64) error {
	if e.conn != conn {
		return status.Errorf(codes.PermissionDenied, "engine %q was registered over another connection; only that connection may use it", e.name)
	}
	return nil
}

// takeEngine removes the named engine for Unregister, after the ownership check.
func (d *Daemon) takeEngine(ctx context.Context, name string) (*engine, error) {
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "unregister: no engine named")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.engines[name]
	if e == nil {
		return nil, status.Errorf(codes.NotFound, "engine %q is not registered", name)
	}
	if err := e.ownedBy(connOf(ctx)); err != nil {
		return nil, err
	}
	delete(d.engines, name)
	return e, nil
}

// checkSharedMemory refuses engine memory that could shrink under the daemon: the descriptor
// must be a sealed memfd carrying F_SEAL_SHRINK, and at least size bytes long. Without the seal
// an engine could ftruncate the file after Register and the next copy would fault (SIGBUS) in
// the daemon.
func checkSharedMemory(f *os.File, size uint64) error {
	fd := int(f.Fd())
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("the descriptor cannot carry seals (%w): engine memory must be a memfd created with MFD_ALLOW_SEALING and sealed with F_SEAL_SHRINK", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return fmt.Errorf("the memfd is not sealed against shrinking: add F_SEAL_SHRINK (fcntl F_ADD_SEALS) before sending it")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if st.Size < 0 || uint64(st.Size) < size {
		return fmt.Errorf("the memfd has %d bytes, fewer than the %d registered", st.Size, size)
	}
	return nil
}
