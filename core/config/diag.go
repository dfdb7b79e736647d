package config

import (
	"fmt"
	"sort"
	"strings"
)

// Kind names one of the file formats this package reads.
type Kind string

// The file kinds Load understands.
const (
	KindTRTLLM   Kind = "trtllm-yaml"   // TensorRT-LLM's LLM API options YAML
	KindClient   Kind = "mooncake-json" // the Mooncake client config mooncake.json
	KindManifest Kind = "pool-manifest" // the pool manifest pool.json
	KindServe    Kind = "kvctl-serve"   // kvctl's own config for serve
)

// Kinds lists every kind in a stable order, for help text and flag completion.
func Kinds() []Kind { return []Kind{KindTRTLLM, KindClient, KindManifest, KindServe, KindDisagg} }

// ParseKind reads a kind name as a user would type it on a command line.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds() {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("unknown config kind %q (want one of %s): %w", s, kindList(), ErrUnknownKind)
}

func kindList() string {
	var s []string
	for _, k := range Kinds() {
		s = append(s, string(k))
	}
	return strings.Join(s, ", ")
}

// Severity says whether a diagnostic makes a file invalid.
type Severity string

// Severities in decreasing order of weight.
const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
)

// Diagnostic is one problem found in a file. Line and Column are 1-based and zero when the
// problem has no place in the file (a missing file-wide setting, a node budget computed from
// the machine). Path is the dotted key path, with list indexes in brackets.
type Diagnostic struct {
	File     string   `json:"file" yaml:"file"`
	Line     int      `json:"line" yaml:"line"`
	Column   int      `json:"column" yaml:"column"`
	Path     string   `json:"path" yaml:"path"`
	Severity Severity `json:"severity" yaml:"severity"`
	Message  string   `json:"message" yaml:"message"`
	Hint     string   `json:"hint,omitempty" yaml:"hint,omitempty"`
}

// String renders "file:line:col: severity: path: message (hint: ...)", leaving out the parts
// that are empty.
func (d Diagnostic) String() string {
	var b strings.Builder
	b.WriteString(d.File)
	if d.Line > 0 {
		fmt.Fprintf(&b, ":%d", d.Line)
		if d.Column > 0 {
			fmt.Fprintf(&b, ":%d", d.Column)
		}
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	b.WriteString(string(d.Severity))
	b.WriteString(": ")
	if d.Path != "" {
		b.WriteString(d.Path)
		b.WriteString(": ")
	}
	b.WriteString(d.Message)
	if d.Hint != "" {
		b.WriteString(" (hint: ")
		b.WriteString(d.Hint)
		b.WriteString(")")
	}
	return b.String()
}

// Diagnostics is every problem found in one or more files.
type Diagnostics []Diagnostic

// HasErrors reports whether any diagnostic is an error.
func (ds Diagnostics) HasErrors() bool {
	for _, d := range ds {
		if d.Severity == SeverityError {
			return true
		}
	}
	return false
}

// Errors returns the error diagnostics, in order.
func (ds Diagnostics) Errors() Diagnostics { return ds.filter(SeverityError) }

// Warnings returns the warning diagnostics, in order.
func (ds Diagnostics) Warnings() Diagnostics { return ds.filter(SeverityWarning) }

func (ds Diagnostics) filter(s Severity) Diagnostics {
	var out Diagnostics
	for _, d := range ds {
		if d.Severity == s {
			out = append(out, d)
		}
	}
	return out
}

// Err returns nil when there is no error diagnostic, otherwise an error wrapping ErrInvalid
// whose text lists every error.
func (ds Diagnostics) Err() error {
	errs := ds.Errors()
	if len(errs) == 0 {
		return nil
	}
	lines := make([]string, len(errs))
	for i, d := range errs {
		lines[i] = d.String()
	}
	return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(lines, "; "))
}

// Sort orders diagnostics by file, position, path and severity, so output is stable.
func (ds Diagnostics) Sort() {
	sort.SliceStable(ds, func(i, j int) bool {
		a, b := ds[i], ds[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Column != b.Column {
			return a.Column < b.Column
		}
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		return a.Severity < b.Severity
	})
}
