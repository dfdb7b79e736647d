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
	// Now is the clock; tests fix it.
	Now func() time.Time
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
