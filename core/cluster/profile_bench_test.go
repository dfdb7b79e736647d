package cluster_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// CPU profiles of BenchmarkLoadFromPeer's timed loops, for finding where a serve case's time
// goes against the native get's on a host where nothing else can be installed:
//
//	KVCTL_BENCH_PROFILE=DIR [KVCTL_BENCH_PROFILE_SECONDS=3] go test -run XXX \
//	  -bench 'BenchmarkLoadFromPeer/^(serve-async|native-get)$/^(admit=2|goroutines=4)$/^(wait|batch=64)$' \
//	  -benchtime 200x ./core/cluster/
//
// With KVCTL_BENCH_PROFILE set, hosts A and B run with --admin-pprof; each timed loop (b.N > 1)
// takes a CPU profile of both over their admin API for KVCTL_BENCH_PROFILE_SECONDS from the
// loop's start, and a native-get loop also profiles this process (the native client) for the
// whole loop. Files: DIR/<benchmark name>-{A,B,self}.pprof. Choose -benchtime so that the loop
// outlasts the seconds, or the profiles include idle time after it. With KVCTL_BENCH_TRACE=1
// as well, each host also writes an execution trace of the same seconds
// (DIR/<benchmark name>-{A,B}.trace): where its goroutines waited, for
// `go tool trace -pprof=net|sched|sync|syscall`.

func benchProfileDir() string { return os.Getenv("KVCTL_BENCH_PROFILE") }

// profileServeArgs are the serve flags the profiles need.
func profileServeArgs() []string {
	if benchProfileDir() == "" {
		return nil
	}
	return []string{"--admin-pprof"}
}

// startProfiles starts the profiles of one timed loop and returns what ends them: it stops this
// process's profile (with self) and waits for the hosts' to arrive. Call it after b.ResetTimer
// and the returned function after b.StopTimer.
func startProfiles(b *testing.B, self bool, hosts ...*host) func() {
	dir := benchProfileDir()
	if dir == "" || b.N <= 1 {
		return func() {}
	}
	secs := 3
	if v := os.Getenv("KVCTL_BENCH_PROFILE_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 60 {
			b.Fatalf("KVCTL_BENCH_PROFILE_SECONDS=%q: want whole seconds from 1 to 60", v)
		}
		secs = n
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	base := filepath.Join(dir, strings.NewReplacer("/", "_", "=", "").Replace(b.Name()))
	var wg sync.WaitGroup
	kinds := []string{"profile"}
	if os.Getenv("KVCTL_BENCH_TRACE") == "1" {
		kinds = append(kinds, "trace")
	}
	errs := make(chan error, len(hosts)*len(kinds))
	for _, h := range hosts {
		for _, kind := range kinds {
			ext := map[string]string{"profile": ".pprof", "trace": ".trace"}[kind]
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- fetchProfile(fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", h.admin, kind, secs), base+"-"+h.name+ext)
			}()
		}
	}
	var f *os.File
	if self {
		var err error
		if f, err = os.Create(base + "-self.pprof"); err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatalf("profiling the native client: %v (is -test.cpuprofile set too?)", err)
		}
	}
	return func() {
		if f != nil {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				b.Error(err)
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				b.Error(err)
			}
		}
	}
}

func fetchProfile(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, msg)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
