package main

import (
	"bytes"
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

// TestServeAndValidateConfigAgree feeds every serve config of testdata/serveconfigs to both
// `kvctl validate-config --kind kvctl-serve` and a real `kvctl serve --config` process: a file
// one accepts the other starts (serve's socket appears), and a file one refuses the other
// refuses with exit 3 and the same errors. The file names say what is expected (accept-*,
// refuse-*), so a change that moves both programs the same wrong way fails as well.
func TestServeAndValidateConfigAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kvctl serve processes")
	}
	kvctl, err := exec.LookPath("kvctl")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := filepath.Abs("testdata/serveconfigs")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in %s: %v", dir, err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) {
			wantOK := strings.HasPrefix(name, "accept-")
			if !wantOK && !strings.HasPrefix(name, "refuse-") {
				t.Fatalf("fixture %s: name it accept-* or refuse-*", name)
			}
			vout, vcode := runKvctl(t, kvctl, dir, "validate-config", "--kind", "kvctl-serve", name)
			started, scode, serr := tryServe(t, kvctl, dir, name)
			if (vcode == 0) != wantOK || started != wantOK {
				t.Fatalf("validate-config exit %d, serve started %v (exit %d); want both to %s\nvalidate-config:\n%s\nserve:\n%s",
					vcode, started, scode, map[bool]string{true: "accept", false: "refuse"}[wantOK], vout, serr)
			}
			if wantOK {
				return
			}
			if vcode != 3 || scode != 3 {
				t.Errorf("validate-config exit %d, serve exit %d; want 3 from both (invalid configuration)", vcode, scode)
			}
			errs := 0
			for _, line := range strings.Split(vout, "\n") {
				_, msg, ok := strings.Cut(line, " error: ")
				if !ok {
					continue
				}
				errs++
				msg, _, _ = strings.Cut(msg, " (hint: ")
				if !strings.Contains(serr, "error: "+msg) {
					t.Errorf("validate-config says %q; serve does not:\n%s", msg, serr)
				}
			}
			if errs == 0 {
				t.Errorf("validate-config refused %s without an error line:\n%s", name, vout)
			}
		})
	}
}

// runKvctl runs kvctl in dir and returns its stdout and stderr together and its exit code.
func runKvctl(t *testing.T, kvctl, dir string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kvctl, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("kvctl %v: %v", args, err)
	return "", 0
}

// tryServe starts `kvctl serve --config file` in dir on a fresh socket with no admin API.
// It reports whether serve started (its socket appeared); a serve that started is stopped with
// SIGTERM. Otherwise it returns serve's exit code and stderr.
func tryServe(t *testing.T, kvctl, dir, file string) (started bool, code int, stderr string) {
	t.Helper()
	sockDir, err := os.MkdirTemp("/tmp", "kvagree") // unix socket paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "k.sock")
	cmd := exec.Command(kvctl, "serve", "--config", file, "--socket", sock, "--admin-addr", "")
	cmd.Dir = dir
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatal(err)
			}
			return false, cmd.ProcessState.ExitCode(), buf.String()
		case <-tick.C:
			if _, err := os.Stat(sock); err == nil {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-done
					t.Errorf("serve did not stop within 30s of SIGTERM")
				}
				return true, 0, buf.String()
			}
		case <-deadline:
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("serve neither started nor exited within 30s:\n%s", buf.String())
		}
	}
}
