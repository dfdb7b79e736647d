package cmdutil

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/spf13/viper"
)

// Factory holds the dependencies commands share. Building the command tree does no I/O; every
// dependency is made on first use, so commands that need no pool or GPU never touch one.
type Factory struct {
	IOStreams *IOStreams
	// Version and Commit describe the build (set by the linker, see cmd/kvctl).
	Version string
	Commit  string
	// Seams are the clock, the wait between refreshes and the memory reading every command
	// takes from here; tests replace them.
	Seams
	// Getenv reads the environment; tests replace it.
	Getenv func(string) string

	// Config is the run's viper instance, filled by the root command before any subcommand
	// runs: flag > KVCTL_* environment > config file > defaults.
	Config *viper.Viper

	loggerOnce sync.Once
	logger     *slog.Logger
	// LogLevel and LogFormat are set from the global flags before a subcommand runs.
	LogLevel  string
	LogFormat string
}

// Logger returns the structured logger writing to standard error in the format and level the
// global flags chose.
func (f *Factory) Logger() *slog.Logger {
	f.loggerOnce.Do(func() {
		f.logger = NewLogger(f.IOStreams.ErrOut, f.LogLevel, f.LogFormat)
	})
	return f.logger
}

// Seams are what commands read from the world besides their IO streams. The Factory holds
// the process's; a command copies them into its options (so tests can replace them there).
// A nil seam means the real thing.
type Seams struct {
	// Now is the clock.
	Now func() time.Time
	// Sleep waits for d or until ctx is done (watch loops wait between reports with it).
	Sleep func(ctx context.Context, d time.Duration) error
	// MemAvailable reads the memory this process may still take, and whether it is known.
	// Nil leaves each command's reading of the system: kvctl serve and validate-config read
	// it differently where /proc/meminfo is missing.
	MemAvailable func() (uint64, bool)
}

// Clock returns Now, or the real clock when it is nil.
func (s Seams) Clock() func() time.Time {
	if s.Now == nil {
		return time.Now
	}
	return s.Now
}

// Sleeper returns Sleep, or SleepContext when it is nil.
func (s Seams) Sleeper() func(ctx context.Context, d time.Duration) error {
	if s.Sleep == nil {
		return SleepContext
	}
	return s.Sleep
}

// SleepContext waits for d or until ctx is done, whichever comes first, and returns ctx's
// error in the second case. Watch loops use it between refreshes.
func SleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
