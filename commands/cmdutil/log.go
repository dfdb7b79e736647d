package cmdutil

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Log levels and formats accepted by --log-level and --log-format.
var (
	LogLevels  = []string{"debug", "info", "warn", "error"}
	LogFormats = []string{"text", "json"}
)

// ParseLogLevel reads a --log-level value.
func ParseLogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("invalid log level %q: want one of %s", s, strings.Join(LogLevels, ", "))
}

// ValidateLogFormat checks a --log-format value.
func ValidateLogFormat(s string) error {
	switch s {
	case "text", "json", "":
		return nil
	}
	return fmt.Errorf("invalid log format %q: want one of %s", s, strings.Join(LogFormats, ", "))
}

// NewLogger returns a slog logger on w. Invalid values fall back to info and text; the root
// command validates them before any logger is made.
func NewLogger(w io.Writer, level, format string) *slog.Logger {
	lvl, err := ParseLogLevel(level)
	if err != nil {
		lvl = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		opts.ReplaceAttr = jsonDuration
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// jsonDuration writes a time.Duration attribute as a Go duration string ("1.5s", "30s"):
// slog's JSON handler would write a bare count of nanoseconds, which reads as seconds or
// milliseconds depending on who reads it.
func jsonDuration(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
