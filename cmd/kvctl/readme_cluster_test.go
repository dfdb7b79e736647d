package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestREADMEClusterBlock runs the README's "Joining a Mooncake cluster" loopback block as
// written: the real mooncake_master, two kvctl serve processes, a cold replay on A and a warm
// one on B, then kvctl stats. Only its ports (free ones instead of the defaults, which another
// run may hold), its socket folder and the binary's path are substituted. The block must wait
// for both hosts to join, every replay must exit 0 (a daemon that was not ready, or saves that
// failed, exit 3), and B must hit what the text says it hits.
func TestREADMEClusterBlock(t *testing.T) {
	pyenv := os.Getenv("KVCTL_PYENV")
	if pyenv == "" {
		pyenv = "../../.cache/pyenv"
	}
	if _, err := os.Stat(filepath.Join(pyenv, "bin", "mooncake_master")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no mooncake_master under %s: make pyenv installs it", pyenv)
		}
		t.Skipf("no mooncake_master under %s (make pyenv)", pyenv)
	}
	pyenv, _ = filepath.Abs(pyenv)
	kvctl, err := exec.LookPath("kvctl")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	i := strings.Index(text, "Tried on one machine exactly so")
	if i < 0 {
		t.Fatal("the README has no loopback cluster block")
	}
	text = text[i:]
	start := strings.Index(text, "```sh\n")
	end := strings.Index(text[start+6:], "```")
	if start < 0 || end < 0 {
		t.Fatal("no sh block after the loopback cluster text")
	}
	block := text[start+6 : start+6+end]
	claims := text[start+6+end:]
	if !strings.Contains(block, "/readyz") {
		t.Error("the block does not wait for the hosts to be ready")
	}

	// Free ports for the documented ones.
	ports := map[string]string{}
	script := regexp.MustCompile(`\b(50051|8080|9003|9480|9481|15000|15001)\b`).ReplaceAllStringFunc(block, func(p string) string {
		if _, ok := ports[p]; !ok {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ports[p] = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
			ln.Close()
		}
		return ports[p]
	})
	dir, err := os.MkdirTemp("", "clr")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	script = strings.ReplaceAll(script, "/tmp/clr", dir)
	script = strings.ReplaceAll(script, "$PWD/.cache/pyenv/bin", filepath.Join(pyenv, "bin"))
	script = strings.ReplaceAll(script, "bin/kvctl ", kvctl+" ")
	// Each replay's output goes under a marker, so that the two tables can be told apart.
	var lines []string
	for _, l := range strings.Split(script, "\n") {
		if strings.Contains(l, " replay ") {
			lines = append(lines, "echo '### replay'")
		}
		if strings.Contains(l, " stats ") {
			lines = append(lines, "echo '### stats'")
		}
		lines = append(lines, l)
	}
	script = "set -e\n" + strings.Join(lines, "\n")

	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "LD_LIBRARY_PATH="+filepath.Join(pyenv, "syslib", "lib"), "XDG_CONFIG_HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A file, not a pipe: the block leaves the master and the serves running in the background,
	// and they would hold a pipe open after the block is done.
	logf, err := os.Create(filepath.Join(dir, "block.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var out bytes.Buffer
	read := func() {
		out.Reset()
		b, _ := os.ReadFile(logf.Name())
		// The master logs its metrics every 10 s, and the serve processes in the background
		// log to the same file (a summary of repeated warnings can land in the middle of a
		// replay's table on a loaded machine); they say nothing here.
		for _, l := range strings.SplitAfter(string(b), "\n") {
			logLine := strings.HasPrefix(l, "time=") && strings.Contains(l, " level=")
			if !logLine && !strings.Contains(l, "master_admin_service.cpp") {
				out.WriteString(l)
			}
		}
	}
	select {
	case err = <-done:
		read()
	case <-time.After(3 * time.Minute):
		read()
		t.Fatalf("the block did not finish in 3 minutes:\n%s", out.String())
	}
	if err != nil {
		t.Fatalf("the README's cluster block failed: %v\n%s", err, out.String())
	}
	parts := strings.Split(out.String(), "### ")
	var replays []string
	for _, p := range parts {
		if strings.HasPrefix(p, "replay\n") {
			replays = append(replays, p)
		}
	}
	if len(replays) != 2 {
		t.Fatalf("want two replays:\n%s", out.String())
	}
	pool := func(table string) (poolHit, total float64) {
		rows := strings.Split(strings.TrimSpace(table), "\n")
		f := strings.Fields(rows[len(rows)-1])
		if len(f) < 13 || f[10] != "yes" || f[12] != "0" {
			t.Fatalf("replay row %q: want READY yes and no failed saves", rows[len(rows)-1])
		}
		p, _ := strconv.ParseFloat(strings.TrimSuffix(f[3], "%"), 64)
		tot, _ := strconv.ParseFloat(strings.TrimSuffix(f[4], "%"), 64)
		return p, tot
	}
	aPool, _ := pool(replays[0])
	bPool, bTotal := pool(replays[1])
	// The text's claims: A cold (about 1% from the pool), B warm (over 90% from the pool, 98% in all).
	if aPool >= 5 || bPool < 90 || bTotal < 98 {
		t.Errorf("A hit %.2f%% in the pool, B %.2f%% (%.2f%% in all); the README says A about 1%%, B over 90%% (98%% in all):\n%s", aPool, bPool, bTotal, out.String())
	}
	if !strings.Contains(claims, fmt.Sprintf("(%.2f%% in all)", bTotal)) {
		t.Logf("the README's figures are from another run; this one: A %.2f%% from the pool, B %.2f%% (%.2f%% in all)", aPool, bPool, bTotal)
	}
	// "kvctl stats showed both serves mounted in a cluster of 2 segments and 2.00 GiB".
	stats := parts[len(parts)-1]
	if !strings.HasPrefix(stats, "stats\n") || strings.Count(stats, "\tcluster\t2 segments, ") != 2 || !strings.Contains(stats, " / 2.00 GiB") {
		t.Errorf("kvctl stats does not show both serves in a cluster of 2 segments and 2.00 GiB:\n%s", stats)
	}
}
