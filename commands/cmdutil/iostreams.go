package cmdutil

import (
	"bytes"
	"io"
	"os"

	"golang.org/x/term"
)

// IOStreams is where a command reads and writes. Data goes to Out; progress, warnings and logs go
// to ErrOut.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer

	stdinTTY  bool
	stdoutTTY bool
	stderrTTY bool
	colorOff  bool
	width     int
}

// System returns streams over the process's standard files with terminal detection, honouring
// NO_COLOR (any non-empty value) and CLICOLOR=0.
func System() *IOStreams {
	s := &IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	s.stdinTTY = isTerminal(os.Stdin)
	s.stdoutTTY = isTerminal(os.Stdout)
	s.stderrTTY = isTerminal(os.Stderr)
	if os.Getenv("NO_COLOR") != "" || os.Getenv("CLICOLOR") == "0" || os.Getenv("TERM") == "dumb" {
		s.colorOff = true
	}
	if s.stdoutTTY {
		if w, _, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
			s.width = w
		}
	}
	return s
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// Test returns streams backed by buffers, all terminals off.
func Test() (*IOStreams, *bytes.Buffer, *bytes.Buffer, *bytes.Buffer) {
	in, out, errOut := &bytes.Buffer{}, &bytes.Buffer{}, &bytes.Buffer{}
	return &IOStreams{In: in, Out: out, ErrOut: errOut, colorOff: true}, in, out, errOut
}

// IsStdinTTY reports whether standard input is a terminal.
func (s *IOStreams) IsStdinTTY() bool { return s.stdinTTY }

// IsStdoutTTY reports whether standard output is a terminal.
func (s *IOStreams) IsStdoutTTY() bool { return s.stdoutTTY }

// IsStderrTTY reports whether standard error is a terminal.
func (s *IOStreams) IsStderrTTY() bool { return s.stderrTTY }

// SetStdoutTTY overrides terminal detection for standard output (tests).
func (s *IOStreams) SetStdoutTTY(v bool) { s.stdoutTTY = v }

// SetStderrTTY overrides terminal detection for standard error (tests).
func (s *IOStreams) SetStderrTTY(v bool) { s.stderrTTY = v }

// SetStdinTTY overrides terminal detection for standard input (tests).
func (s *IOStreams) SetStdinTTY(v bool) { s.stdinTTY = v }

// SetColorEnabled forces colour on or off.
func (s *IOStreams) SetColorEnabled(v bool) { s.colorOff = !v }

// ColorEnabled reports whether output to standard output may carry colour.
func (s *IOStreams) ColorEnabled() bool { return s.stdoutTTY && !s.colorOff }

// TerminalWidth is the width of the terminal on standard output, or 0 when unknown.
func (s *IOStreams) TerminalWidth() int { return s.width }
