package cmdutil

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// PoolError gives a failed request to a pool (a *probe.PoolError in err's chain) the exit code
// and words the pool commands document: 4 with the address when nothing answered (saying so when
// it did not answer within --timeout), 1 otherwise. An interrupted request stays an interruption,
// and any other error is returned as it is.
func PoolError(err error) error {
	var pe *probe.PoolError
	if !errors.As(err, &pe) {
		return err
	}
	cause := pe.Err
	if errors.Is(cause, context.Canceled) {
		return cause
	}
	if pe.RPC {
		if errors.Is(cause, masterrpc.ErrUnavailable) {
			return Unreachable(fmt.Errorf("pool %s: %w", pe.Addr, cause))
		}
		return fmt.Errorf("pool %s: %w", pe.Addr, cause)
	}
	switch {
	case errors.Is(cause, mooncake.ErrUnreachable):
		if pe.TimedOut() {
			return Unreachable(fmt.Errorf("pool %s did not answer within %s (--timeout): %w", pe.Addr, pe.Timeout, cause))
		}
		return Unreachable(Briefly(fmt.Sprintf("pool %s is unreachable", pe.Addr), cause))
	case errors.Is(cause, mooncake.ErrMalformedResponse):
		return fmt.Errorf("pool %s sent a response kvctl cannot read: %w", pe.Addr, cause)
	}
	return Briefly(fmt.Sprintf("pool %s", pe.Addr), cause)
}
