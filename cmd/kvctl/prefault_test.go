package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// rssBytes reads a process's resident memory from /proc.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// TestServePoolPrefault starts real `kvctl serve` processes with a 128 MiB embedded pool: set by
// the flag, the environment or the config file, pool-prefault makes the whole pool resident
// before the daemon is ready; without it the process holds less than the pool.
func TestServePoolPrefault(t *testing.T) {
	const pool = 128 << 20
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	if err := os.WriteFile(cfg, []byte("pool-prefault: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  string
		args []string
		want bool
	}{
		{"off", "", nil, false},
		{"flag", "", []string{"--pool-prefault"}, true},
		{"env", "KVCTL_POOL_PREFAULT=true", nil, true},
		{"config", "", []string{"--config", cfg}, true},
		{"flag over config", "", []string{"--config", cfg, "--pool-prefault=false"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if k, v, ok := strings.Cut(c.env, "="); ok {
				t.Setenv(k, v)
			}
			p := startServe(t, shortSocket(t), c.args...)
			rss := rssBytes(t, p.cmd.Process.Pid)
			if got := rss >= pool; got != c.want {
				t.Fatalf("resident %d MiB with a %d MiB pool; prefaulted = %v, want %v\n%s", rss>>20, pool>>20, got, c.want, p.stderr)
			}
		})
	}
}
