// Package daemontest runs a real `kvctl serve` daemon inside a test:
//
//	r := daemontest.Start(t, daemon.Config{Pool: pool})
//	c, err := engineapi.Dial(r.Info.Socket)
//
// The daemon serves until the test ends, when it is stopped and an error from its Run fails
// the test. The package is for tests only; nothing outside _test.go files imports it.
package daemontest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/daemon"
)

// How long Start waits for the daemon to be ready, and Stop for it to return.
const (
	ReadyTimeout = 10 * time.Second
	StopTimeout  = 30 * time.Second
)

// Running is a daemon started by Start.
type Running struct {
	Daemon *daemon.Daemon
	// Info is what the daemon reported when it became ready: its socket and admin address.
	Info daemon.Info

	cancel  context.CancelFunc
	done    chan error
	stop    sync.Once
	stopErr error
}

// Start runs a daemon with cfg until the test ends and returns it once it is ready. Fields
// left empty are filled: Socket with a socket in a new temporary folder (short, as a unix
// socket path must be), AdminAddr with a free loopback port, Logger with one that discards,
// and Version with "test". The test fails at once if the daemon cannot start, and at its end
// if the daemon stops with an error.
func Start(tb testing.TB, cfg daemon.Config) *Running {
	tb.Helper()
	if cfg.Socket == "" {
		dir, err := os.MkdirTemp("", "kv")
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = os.RemoveAll(dir) })
		cfg.Socket = filepath.Join(dir, "kvctl.sock")
	}
	if cfg.AdminAddr == "" {
		cfg.AdminAddr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Version == "" {
		cfg.Version = "test"
	}
	d, err := daemon.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{Daemon: d, cancel: cancel, done: make(chan error, 1)}
	ready := make(chan daemon.Info, 1)
	go func() { r.done <- d.Run(ctx, func(i daemon.Info) { ready <- i }) }()
	select {
	case r.Info = <-ready:
	case err := <-r.done:
		cancel()
		tb.Fatalf("daemon exited before it was ready: %v", err)
	case <-time.After(ReadyTimeout):
		tb.Cleanup(func() { _ = r.Stop() })
		tb.Fatalf("daemon did not become ready in %v", ReadyTimeout)
	}
	tb.Cleanup(func() {
		if err := r.Stop(); err != nil {
			tb.Errorf("daemon: %v", err)
		}
	})
	return r
}

// Stop stops the daemon and returns the error its Run returned; later calls return the same.
func (r *Running) Stop() error {
	r.stop.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				r.stopErr = fmt.Errorf("stopped with %w", err)
			}
		case <-time.After(StopTimeout):
			r.stopErr = fmt.Errorf("did not stop in %v", StopTimeout)
		}
	})
	return r.stopErr
}
