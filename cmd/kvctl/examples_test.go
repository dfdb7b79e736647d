package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// example is one bin/kvctl command of the README's Examples section. In a console block the
// lines after a "$ " command up to the next one are its output (want); a command whose comment
// says "until Ctrl-C" runs until interrupted.
type example struct {
	cmd     string
	console bool
	want    []string
	watch   bool
}

// readmeExamples returns the bin/kvctl commands of the README's Examples section, in order, with
// continued lines joined and trailing comments cut.
func readmeExamples(t *testing.T) []example {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(readme), "\n## Examples\n") != 1 {
		t.Fatal("the README must have one Examples section")
	}
	if strings.Contains(string(readme), "go install github.com/kvctl/kvctl/cmd/kvctl@latest") {
		t.Error("the README tells to go install a module that is not published")
	}
	section := string(readme)
	section = section[strings.Index(section, "\n## Examples\n"):]
	if i := strings.Index(section[1:], "\n## "); i >= 0 {
		section = section[:i+1]
	}
	var out []example
	fence := ""
	lines := strings.Split(section, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(line, "```") {
			if fence == "" {
				fence = strings.TrimPrefix(line, "```")
			} else {
				fence = ""
			}
			continue
		}
		if fence == "" {
			continue
		}
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(lines[i])
		}
		console := fence == "console"
		if console && !strings.HasPrefix(line, "$ ") {
			if len(out) > 0 && out[len(out)-1].console {
				out[len(out)-1].want = append(out[len(out)-1].want, line)
			}
			continue
		}
		line = strings.TrimSpace(strings.TrimPrefix(line, "$ "))
		if !strings.HasPrefix(line, "bin/kvctl ") {
			continue
		}
		e := example{console: console}
		if j := strings.Index(line, "  #"); j >= 0 {
			e.watch = strings.Contains(line[j:], "until Ctrl-C")
			line = strings.TrimSpace(line[:j])
		}
		e.cmd = line
		out = append(out, e)
	}
	if len(out) < 8 {
		t.Fatalf("found %d commands in the README's Examples", len(out))
	}
	return out
}

// remote says whether a command names a host other than this one (the README's 10.0.0.x).
func remote(cmd string) bool { return strings.Contains(cmd, "10.0.0.") }

// shape is a command's subcommand and the set of flags it gives, without their values: a remote
// example and its loopback variant have the same shape.
func shape(cmd string) string {
	f := strings.Fields(cmd)
	var sub string
	var flags []string
	for _, w := range f[1:] {
		switch {
		case strings.HasPrefix(w, "--"):
			if !slices.Contains(flags, w) {
				flags = append(flags, w)
			}
		case sub == "" && !strings.HasPrefix(w, "-"):
			sub = w
		}
	}
	slices.Sort(flags)
	return sub + " " + strings.Join(flags, " ")
}

func fields(lines []string) []string {
	var out []string
	for _, l := range lines {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestREADMEExamples runs every bin/kvctl command of the README's Examples section from the
// repository root, against the files under examples/ and a real kvctl serve started for the
// loopback ones (its admin address stands in for 127.0.0.1:9480, its socket is the default one
// under XDG_RUNTIME_DIR). Each must succeed, a console block's output must be what the README
// shows (compared field by field, since the README aligns tab-separated columns with spaces),
// every example against a remote host must have a loopback variant of the same shape, and a
// replay comparing --set values must show runs that differ and hit the pool. Before the
// examples run, the loopback probe must exit 3 against the empty pool, as the text says.
func TestREADMEExamples(t *testing.T) {
	examples := readmeExamples(t)

	var local []string
	for _, e := range examples {
		if !remote(e.cmd) {
			local = append(local, shape(e.cmd))
		}
	}
	for _, e := range examples {
		if remote(e.cmd) && !slices.Contains(local, shape(e.cmd)) {
			t.Errorf("%s: no loopback variant (%s) in the Examples", e.cmd, shape(e.cmd))
		}
	}

	dir := t.TempDir()
	run, err := os.MkdirTemp("", "kvrun")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	// The folder kvctl serve makes for its default socket, made here since --socket is given.
	if err := os.Mkdir(filepath.Join(run, "kvctl"), 0o700); err != nil {
		t.Fatal(err)
	}
	srv := startServe(t, filepath.Join(run, "kvctl", "kvctl.sock"))
	env := append(os.Environ(), "XDG_CONFIG_HOME="+dir, "XDG_RUNTIME_DIR="+run, "NO_COLOR=1")
	files := regexp.MustCompile(`(examples|core/replay/testdata)/[a-z_0-9]+\.[a-z]+`)
	shell := func(c string) string {
		s := strings.ReplaceAll(c, "bin/kvctl ", "kvctl ")
		s = strings.ReplaceAll(s, "> mooncake.json", "> "+filepath.Join(dir, "mooncake.json"))
		s = strings.ReplaceAll(s, "--plot hits.png", "--plot "+filepath.Join(dir, "hits.png"))
		s = strings.ReplaceAll(s, "127.0.0.1:9480", srv.admin)
		s = strings.ReplaceAll(s, "replay --live", "replay --live --admin "+srv.admin)
		return s
	}
	command := func(c string) *exec.Cmd {
		cmd := exec.Command("bash", "-o", "pipefail", "-c", shell(c))
		cmd.Dir = "../.."
		cmd.Env = env
		return cmd
	}

	// "exit 3 ... unless all 3 full blocks of the example prompt hit": before the examples
	// store the prompt, the loopback probe must fail.
	probed := false
	for _, e := range examples {
		if !remote(e.cmd) && strings.Contains(e.cmd, " probe-pool ") && strings.Contains(e.cmd, "--expect-hit") && !probed {
			probed = true
			out, err := command(e.cmd).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 3 {
				t.Errorf("%s against an empty pool: %v, want exit 3\n%s", e.cmd, err, out)
			}
		}
	}
	if !probed {
		t.Error("the Examples have no loopback probe-pool --expect-hit")
	}

	for _, e := range examples {
		if remote(e.cmd) {
			continue
		}
		for _, f := range files.FindAllString(e.cmd, -1) {
			if _, err := os.Stat(filepath.Join("../..", f)); err != nil {
				t.Errorf("%s: %v", e.cmd, err)
			}
		}
		if e.console && len(e.want) == 0 && !e.watch {
			t.Errorf("%s: a console example must show its output", e.cmd)
		}
		if e.watch {
			watchExample(t, command(e.cmd), e.cmd)
			continue
		}
		out, err := command(e.cmd).CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v\n%s", e.cmd, err, out)
			continue
		}
		if !e.console {
			continue
		}
		got := fields(strings.Split(strings.ReplaceAll(string(out), srv.admin, "127.0.0.1:9480"), "\n"))
		if want := fields(e.want); !slices.Equal(got, want) {
			t.Errorf("%s prints\n%s\nthe README shows\n%s", e.cmd, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if strings.Contains(e.cmd, " replay ") && strings.Contains(e.cmd, "--set ") {
			checkComparison(t, e.cmd, got)
		}
		if strings.Contains(e.cmd, "--plot hits.png") {
			checkPlot(t, filepath.Join(dir, "hits.png"))
		}
	}
}

// checkComparison checks an offline replay's table that compares --set values: every run hits
// the pool, and no two runs show the same figures.
func checkComparison(t *testing.T, cmd string, table []string) {
	t.Helper()
	if len(table) < 3 {
		t.Errorf("%s: want a header and two runs, got %q", cmd, table)
		return
	}
	head := strings.Fields(table[0])
	col := slices.Index(head, "POOL")
	if col < 0 {
		t.Errorf("%s: no POOL column in %q", cmd, table[0])
		return
	}
	seen := map[string]bool{}
	for _, row := range table[1:] {
		f := strings.Fields(row)
		if len(f) != len(head) {
			t.Errorf("%s: row %q", cmd, row)
			continue
		}
		if p, err := strconv.ParseFloat(strings.TrimSuffix(f[col], "%"), 64); err != nil || p <= 0 {
			t.Errorf("%s: run %s hits the pool for %s of its input tokens", cmd, f[0], f[col])
		}
		figures := strings.Join(f[1:], " ")
		if seen[figures] {
			t.Errorf("%s: two runs show the same figures %s", cmd, figures)
		}
		seen[figures] = true
	}
}

// checkPlot checks the plot the README's replay draws against the committed docs/replay-plot.png
// (KVCTL_UPDATE_SCREENSHOTS=1 writes it). The rasteriser's floating point may round otherwise
// where the compiler fuses multiply-adds, so the bytes are compared on amd64 only.
func checkPlot(t *testing.T, png string) {
	t.Helper()
	got, err := os.ReadFile(png)
	if err != nil {
		t.Fatal(err)
	}
	const committed = "../../docs/replay-plot.png"
	if os.Getenv("KVCTL_UPDATE_SCREENSHOTS") == "1" {
		if err := os.WriteFile(committed, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOARCH == "amd64" && !bytes.Equal(got, want) {
		t.Errorf("%s is not what the README's replay draws; KVCTL_UPDATE_SCREENSHOTS=1 go test -run TestREADMEExamples ./cmd/kvctl rewrites it", committed)
	}
}

// watchExample runs a --watch example until it has printed its first report, then interrupts
// it as Ctrl-C would: it must exit 130.
func watchExample(t *testing.T, cmd *exec.Cmd, name string) {
	t.Helper()
	var out lockedBuilder
	cmd.Stdout, cmd.Stderr = writerOf(&out), writerOf(&out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "\tkind\t") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "\tkind\t") {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Errorf("%s printed no report in 20s:\n%s", name, out.String())
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("%s interrupted: %v, want exit 130\n%s", name, err, out.String())
		}
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Errorf("%s did not stop on SIGINT", name)
	}
}
