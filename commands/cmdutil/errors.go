package cmdutil

import (
	"context"
	"errors"
	"fmt"
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
  1    failure at run time
  2    usage error
  3    validation failed (invalid config, a probe or replay check that did not hold)
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
