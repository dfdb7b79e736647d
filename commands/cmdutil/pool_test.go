package cmdutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
)

// unreachable wraps a transport error as the admin client does.
func unreachable(err error) error {
	return fmt.Errorf("mooncake admin http://h:1/v1/stats: %w: %w", mooncake.ErrUnreachable, err)
}

func TestPoolError(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errors.New("connection refused"))}
	tests := []struct {
		name string
		err  error
		code int
		want string
	}{
		{"client timeout", &probe.PoolError{Addr: "http://h:1", Timeout: 200 * time.Millisecond, Err: unreachable(&url.Error{Op: "Get", URL: "http://h:1", Err: os.ErrDeadlineExceeded})},
			ExitUnreachable, "pool http://h:1 did not answer within 200ms (--timeout)"},
		{"deadline", &probe.PoolError{Addr: "http://h:1", Timeout: time.Second, Err: unreachable(context.DeadlineExceeded)},
			ExitUnreachable, "did not answer within 1s"},
		{"refused", &probe.PoolError{Addr: "http://h:1", Err: unreachable(refused)}, ExitUnreachable, "pool http://h:1 is unreachable: "},
		// Words alone do not make a timeout: only the error's type says so.
		{"timeout in words only", &probe.PoolError{Addr: "http://h:1", Err: unreachable(errors.New("i/o timeout, deadline exceeded"))}, ExitUnreachable, "pool http://h:1 is unreachable"},
		{"malformed", &probe.PoolError{Addr: "http://h:1", Err: fmt.Errorf("x: %w", mooncake.ErrMalformedResponse)}, ExitFailure, "pool http://h:1 sent a response kvctl cannot read"},
		{"rpc unavailable", &probe.PoolError{Addr: "rpc://h:2", RPC: true, Err: fmt.Errorf("dial: %w", masterrpc.ErrUnavailable)}, ExitUnreachable, "pool rpc://h:2: dial"},
		{"rpc other", &probe.PoolError{Addr: "rpc://h:2", RPC: true, Err: errors.New("code -1")}, ExitFailure, "pool rpc://h:2: code -1"},
		{"interrupted", &probe.PoolError{Addr: "http://h:1", Err: context.Canceled}, ExitInterrupted, "context canceled"},
		{"not a pool error", errors.New("plain"), ExitFailure, "plain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := PoolError(tt.err)
			if got := ExitCode(err); got != tt.code {
				t.Errorf("exit code %d, want %d (%v)", got, tt.code, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("message %q, want it to contain %q", err, tt.want)
			}
			if tt.name == "timeout in words only" && strings.Contains(err.Error(), "did not answer within") {
				t.Errorf("an untyped error was taken for a timeout: %v", err)
			}
		})
	}
}

func TestWatch(t *testing.T) {
	for _, tt := range []struct {
		format, want string
	}{
		{FormatJSON, "r1\nr3\n"},
		{FormatYAML, "r1\n---\nr3\n"},
		{FormatTable, "r1\n\nr3\n"},
	} {
		t.Run(tt.format, func(t *testing.T) {
			ios, _, out, errOut := Test()
			var slept []time.Duration
			w := Watch{IO: ios, Every: 3, Format: tt.format, Iterations: 4, Seams: Seams{
				Now:   func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) },
				Sleep: func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil }}}
			n := 0
			err := w.Run(context.Background(), func(context.Context) (func() error, error) {
				n++
				if n == 2 || n == 4 {
					return nil, Unreachable(fmt.Errorf("pool p%d down", n))
				}
				return func() error { _, err := fmt.Fprintf(ios.Out, "r%d\n", n); return err }, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("stdout %q, want %q", out, tt.want)
			}
			if errOut.String() != "03:04:05: pool p2 down\n03:04:05: pool p4 down\n" {
				t.Errorf("stderr %q", errOut)
			}
			if len(slept) != 3 || slept[0] != 3*time.Second {
				t.Errorf("slept %v, want 3 times 3s", slept)
			}
		})
	}
	ios, _, _, _ := Test()
	boom := errors.New("boom")
	err := Watch{IO: ios, Every: 1, Seams: Seams{Sleep: func(context.Context, time.Duration) error { return nil }}}.Run(context.Background(), func(context.Context) (func() error, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("a failure other than an unreachable pool: got %v, want it to end the watch", err)
	}
}
