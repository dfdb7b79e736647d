// Package cmdtest holds what the command packages' tests share: a factory over test streams,
// running a command's flag parsing on a shell-like argument string, and golden files.
package cmdtest

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/shlex"
	"github.com/spf13/cobra"

	"github.com/kvctl/kvctl/commands/cmdutil"
)

// Factory returns a factory over test streams (no terminal, no colour), a fixed clock and an
// empty environment.
func Factory() *cmdutil.Factory {
	ios, _, _, _ := cmdutil.Test()
	return &cmdutil.Factory{IOStreams: ios, Seams: cmdutil.Seams{Now: func() time.Time { return time.Unix(0, 0).UTC() }}, Getenv: func(string) string { return "" }}
}

// Execute runs cmd on args, split as a shell would, with its output discarded, and returns the
// command's error. Tests build cmd with a runF that records the options.
func Execute(t testing.TB, cmd *cobra.Command, args string) error {
	t.Helper()
	argv, err := shlex.Split(args)
	if err != nil {
		t.Fatalf("arguments %q: %v", args, err)
	}
	cmd.SetArgs(argv)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	return cmd.Execute()
}

// Golden compares got with the file testdata/name, or rewrites the file when update is set
// (go test -update).
func Golden(t testing.TB, name string, got []byte, update bool) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}
