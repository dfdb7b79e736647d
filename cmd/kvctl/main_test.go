package main

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"kvctl": func() { os.Exit(run(os.Args[1:])) },
	})
}

// TestScripts runs the end-to-end CLI transcripts in testdata/script: each runs the real kvctl
// binary and checks its output and exit code.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		UpdateScripts:       os.Getenv("KVCTL_UPDATE_SCRIPTS") == "1",
		Cmds:                map[string]func(*testscript.TestScript, bool, []string){"exitcode": cmdExitCode},
		Setup: func(env *testscript.Env) error {
			env.Setenv("NO_COLOR", "1")
			env.Setenv("XDG_CONFIG_HOME", env.WorkDir+"/.config")
			return nil
		},
	})
}

// cmdExitCode runs a program and checks its exit status: `exitcode 3 kvctl validate-config x`.
// Its stdout and stderr stay available to the stdout and stderr commands that follow.
func cmdExitCode(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exitcode CODE PROGRAM [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("exitcode: bad code %q", args[0])
	}
	got := 0
	if err := ts.Exec(args[1], args[2:]...); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("exitcode: %v", err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", args[1], got, want)
	}
}
