package cmdutil

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/kvctl/kvctl/core/boundedio"
)

// Exit codes. See the package documentation.
const (
	ExitOK          = 0
	ExitFailure     = 1
	ExitUsage       = 2
	ExitValidation  = 3
	ExitUnreachable = 4
	ExitInterrupted = 130
)

// ExitCodesHelp is the exit-code table every command's help ends with.
const ExitCodesHelp = `Exit codes:
  0    success
  1    failure at run time (a file that cannot be read included)
  2    usage error (a flag or KVCTL_* value that does not parse or is out of bounds)
  3    validation failed (invalid config or input file, a probe or replay check that did not hold)
  4    pool, engine or GPU unreachable
  130  interrupted`

// ExitError carries an exit code with the error that caused it.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// FlagError is a usage error: bad flags or arguments. The usage is printed after it.
type FlagError struct{ Err error }

func (e *FlagError) Error() string { return e.Err.Error() }
func (e *FlagError) Unwrap() error { return e.Err }

// FlagErrorf returns a usage error.
func FlagErrorf(format string, args ...any) error {
	return &FlagError{Err: fmt.Errorf(format, args...)}
}

// ValidationErrorf returns an error that exits with ExitValidation.
func ValidationErrorf(format string, args ...any) error {
	return &ExitError{Code: ExitValidation, Err: fmt.Errorf(format, args...)}
}

// Unreachable wraps err so that it exits with ExitUnreachable.
func Unreachable(err error) error {
	if err == nil {
		return nil
	}
	return &ExitError{Code: ExitUnreachable, Err: err}
}

// ErrSilent exits with ExitFailure without printing anything more: the command already said why.
var ErrSilent = errors.New("silent error")

// SilentExit returns an error that exits with code and prints nothing.
func SilentExit(code int) error { return &ExitError{Code: code, Err: ErrSilent} }

// ExitCode maps an error returned by a command to the process exit code.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	var fe *FlagError
	if errors.As(err, &fe) {
		return ExitUsage
	}
	if errors.Is(err, context.Canceled) {
		return ExitInterrupted
	}
	return ExitFailure
}

// IsSilent reports whether err should exit without a message.
func IsSilent(err error) bool { return errors.Is(err, ErrSilent) }

// CheckCount bounds a count given as a flag: a value outside [lo, hi] is a usage error, found
// before anything is allocated for it.
func CheckCount(flag string, v, lo, hi int) error {
	if v < lo || v > hi {
		return FlagErrorf("--%s %d: want %d to %d", flag, v, lo, hi)
	}
	return nil
}

// OpenInput opens a file named on the command line for reading. A file that cannot be read
// (missing, a directory, no permission) is a failure at run time, exit 1, in every command;
// a file that reads but holds something invalid is a validation failure, exit 3.
func OpenInput(name string) (*os.File, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		_ = f.Close()
		return nil, fmt.Errorf("%s %w", name, boundedio.ErrIsDir)
	}
	return f, nil
}
