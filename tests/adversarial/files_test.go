package adversarial

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runKvctl runs kvctl with args, sends sig after delay when sig is not 0, and returns the exit
// code, the output and how long it ran. The run is killed after a minute.
func runKvctl(t *testing.T, sig syscall.Signal, delay time.Duration, args ...string) (int, string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kvctl, args...)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if sig != 0 {
		time.AfterFunc(delay, func() { _ = cmd.Process.Signal(sig) })
	}
	err := cmd.Wait()
	took := time.Since(start)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), took
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), took
	}
	t.Fatalf("kvctl %v: %v", args, err)
	return 0, "", 0
}

// TestEndlessConfigFiles: a config named /dev/zero (which stat calls empty) is read through the
// hard limit and refused; a FIFO whose writer never writes is interrupted by SIGTERM and
// SIGINT (exit 130); a FIFO without a writer does not block.
func TestEndlessConfigFiles(t *testing.T) {
	for _, args := range [][]string{
		{"validate-config", "/dev/zero"},
		{"serve", "--config", "/dev/zero", "--socket", filepath.Join(socketDir(t), "s"), "--admin-addr", ""},
		{"--config", "/dev/zero", "version"},
		{"replay", "/dev/zero"},
	} {
		code, out, took := runKvctl(t, 0, 0, args...)
		if bounded := strings.Contains(out, "larger than") || strings.Contains(out, "longer than"); code == 0 || !bounded {
			t.Errorf("kvctl %s: exit %d in %v:\n%s", strings.Join(args, " "), code, took, tail(out, 10))
		}
	}

	dir := t.TempDir()
	fifo := filepath.Join(dir, "config.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// No writer: the read ends at once (an empty file), without blocking.
	code, out, took := runKvctl(t, 0, 0, "validate-config", fifo)
	if took > 30*time.Second {
		t.Errorf("a FIFO without a writer blocked validate-config for %v (exit %d):\n%s", took, code, out)
	}
	// A writer that holds it open and writes nothing: the signal interrupts the read.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		w, err := os.OpenFile(fifo, os.O_RDWR, 0) // O_RDWR: open without waiting for a reader
		if err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"validate-config", fifo}, {"serve", "--config", fifo, "--socket", filepath.Join(socketDir(t), "s"), "--admin-addr", ""}} {
			code, out, took := runKvctl(t, sig, 500*time.Millisecond, args...)
			if code != 130 || took > 20*time.Second {
				t.Errorf("kvctl %s interrupted by %v: exit %d after %v, want 130 promptly:\n%s", args[0], sig, code, took, tail(out, 10))
			}
		}
		_ = w.Close()
	}
}
