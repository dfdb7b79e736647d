package probe

import (
	"context"
	"errors"
	"net"
	"time"
)

// PoolError is a request to a pool that failed. Addr is the pool as reports name it: an admin
// address (http://host:port) or a master's RPC address (rpc://host:port, RPC set). Timeout is
// the bound each request to an admin address had.
type PoolError struct {
	Addr    string
	RPC     bool
	Timeout time.Duration
	Err     error
}

func (e *PoolError) Error() string { return "pool " + e.Addr + ": " + e.Err.Error() }

// Unwrap returns the request's error.
func (e *PoolError) Unwrap() error { return e.Err }

// TimedOut reports whether the pool did not answer in time: the request's deadline passed
// (context.DeadlineExceeded) or its connection timed out (a net.Error whose Timeout is true,
// as the HTTP client's own timeout is).
func (e *PoolError) TimedOut() bool { return IsTimeout(e.Err) }

// IsTimeout reports whether err is, or wraps, a timeout: context.DeadlineExceeded or a net.Error
// that says it timed out.
func IsTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ErrNoStatsLines is returned (wrapped) by Gather for a log that has no stats line to report.
var ErrNoStatsLines = errors.New("no stats lines")

// noStatsLines says which log had no stats line, and why, in words a user can act on.
type noStatsLines struct{ msg string }

func (e *noStatsLines) Error() string        { return e.msg }
func (e *noStatsLines) Is(target error) bool { return target == ErrNoStatsLines }
