package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/enginesim"
)

// The memory benchmarks run one round of four engines (256 KiB pages, 32 MiB of page data per
// engine: 128 MiB in all) against a 256 MiB pool: a cold pass that saves every block, then a
// warm pass that loads them all. Run each on its own (-bench 'ServeMemory$', -benchtime 1x):
// a process that ran other benchmarks first has heap and RSS left over from them.
const (
	memPoolBytes = 256 << 20
	memPage      = 256 << 10
	memPerEngine = 32 << 20
)

// procStatus holds the memory lines of /proc/<pid>/status, in bytes.
type procStatus struct {
	VmRSS, VmHWM, RssAnon, RssFile, RssShmem int64 //nolint:revive // var-naming: the kernel's names for these lines
}

func readStatus(pid string) (procStatus, error) {
	f, err := os.Open(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return procStatus{}, err
	}
	defer f.Close()
	var st procStatus
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "VmRSS":
			st.VmRSS = kb << 10
		case "VmHWM":
			st.VmHWM = kb << 10
		case "RssAnon":
			st.RssAnon = kb << 10
		case "RssFile":
			st.RssFile = kb << 10
		case "RssShmem":
			st.RssShmem = kb << 10
		}
	}
	return st, sc.Err()
}

type memSample struct {
	heapInuse int64
	status    procStatus
}

func sampleSelf(b *testing.B, gc bool) memSample {
	if gc {
		runtime.GC()
		debug.FreeOSMemory()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st, err := readStatus("self")
	if err != nil {
		b.Fatal(err)
	}
	return memSample{heapInuse: int64(ms.HeapInuse), status: st}
}

// peaks samples fn every 10 ms until stop is called and keeps the largest value of each field.
type peaks struct {
	mu   sync.Mutex
	max  memSample
	stop chan struct{}
	done chan struct{}
}

func samplePeaks(fn func() (memSample, error)) *peaks {
	p := &peaks{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if s, err := fn(); err == nil {
				p.mu.Lock()
				p.max.heapInuse = max(p.max.heapInuse, s.heapInuse)
				p.max.status.VmRSS = max(p.max.status.VmRSS, s.status.VmRSS)
				p.max.status.RssAnon = max(p.max.status.RssAnon, s.status.RssAnon)
				p.max.status.RssFile = max(p.max.status.RssFile, s.status.RssFile)
				p.max.status.RssShmem = max(p.max.status.RssShmem, s.status.RssShmem)
				p.max.status.VmHWM = max(p.max.status.VmHWM, s.status.VmHWM)
				p.mu.Unlock()
			}
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

func (p *peaks) end() memSample {
	close(p.stop)
	<-p.done
	return p.max
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// memRound runs one cold and one warm round of be, checking that the warm one loads every block.
func memRound(b *testing.B, be *benchEngines, i int) {
	reqs := be.round(uint64(1000+i), fmt.Sprintf("m%d", i))
	if _, err := be.run(reqs); err != nil {
		b.Fatal(err)
	}
	warm := make([][]enginesim.Request, len(reqs))
	for e := range reqs {
		warm[e] = renamed(reqs[e], "warm")
	}
	res, err := be.run(warm)
	if err != nil {
		b.Fatal(err)
	}
	for e, r := range res {
		if r.LoadedBlocks != throughputRequests*be.blocks {
			b.Fatalf("engine %d: warm round loaded %d blocks, want %d", e, r.LoadedBlocks, throughputRequests*be.blocks)
		}
	}
}

// BenchmarkServeMemory measures an in-process daemon: Go heap in use (HeapInuse) and resident
// anonymous memory (RssAnon of /proc/self/status) over the process before the daemon, at rest
// after it starts, with four engines registered, at the peak of a cold and warm round, and
// after it. The pool's segment is one Go allocation of its whole capacity made at start: it is
// in HeapInuse at once, but resident only as pages are written. The engines run in this
// process, so the peaks include their own allocations; their shared memory is RssShmem, not
// RssAnon.
func BenchmarkServeMemory(b *testing.B) {
	base := sampleSelf(b, true)
	r := benchStart(b, memPoolBytes)
	rest := sampleSelf(b, true)
	be := startEngines(b, r.Info.Socket, memPage, memPerEngine, "mem")
	registered := sampleSelf(b, true)
	p := samplePeaks(func() (memSample, error) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		st, err := readStatus("self")
		return memSample{heapInuse: int64(ms.HeapInuse), status: st}, err
	})
	for i := 0; b.Loop(); i++ {
		memRound(b, be, i)
	}
	peak := p.end()
	after := sampleSelf(b, true)
	ps, err := r.Daemon.Pool().Stats(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	d := func(s memSample) (heap, anon float64) {
		return mib(s.heapInuse - base.heapInuse), mib(s.status.RssAnon - base.status.RssAnon)
	}
	for _, row := range []struct {
		name string
		s    memSample
	}{{"rest", rest}, {"registered", registered}, {"peak", peak}, {"after", after}} {
		h, a := d(row.s)
		b.ReportMetric(h, row.name+"-heap-MiB")
		b.ReportMetric(a, row.name+"-anon-MiB")
		b.Logf("%-10s heap %+8.1f MiB  rss-anon %+8.1f MiB  rss-shmem %8.1f MiB  (pool segment %d MiB, %.1f MiB used)",
			row.name, h, a, mib(row.s.status.RssShmem), memPoolBytes>>20, mib(ps.UsedBytes))
	}
	b.ReportMetric(mib(ps.UsedBytes), "pool-used-MiB")
}

// BenchmarkServeProcessMemory starts the built binary (KVCTL_BIN, default /tmp/kvctl) as
// `kvctl serve --pool-size 256MiB`, and reads its /proc/<pid>/status at rest, with four engines
// registered, at the peak of a cold and warm round and after it. Only with
// KVCTL_BENCH_PROCESS=1; build the binary first: go build -o /tmp/kvctl ./cmd/kvctl.
func BenchmarkServeProcessMemory(b *testing.B) {
	if os.Getenv("KVCTL_BENCH_PROCESS") != "1" {
		b.Skip("set KVCTL_BENCH_PROCESS=1 (and build /tmp/kvctl) to measure a kvctl serve process")
	}
	bin := os.Getenv("KVCTL_BIN")
	if bin == "" {
		bin = "/tmp/kvctl"
	}
	dir, err := os.MkdirTemp("", "kv")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "kvctl.sock")
	cmd := exec.Command(bin, "serve", "--pool-size", "256MiB", "--admin-addr", "127.0.0.1:0", "--socket", sock)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	ready := make(chan struct{})
	var logMu sync.Mutex
	var logBuf bytes.Buffer
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			logMu.Lock()
			logBuf.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			if !once && strings.TrimSpace(sc.Text()) == "ready" {
				once = true
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		logMu.Lock()
		defer logMu.Unlock()
		b.Fatalf("kvctl serve did not become ready:\n%s", logBuf.String())
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	read := func() procStatus {
		st, err := readStatus(pid)
		if err != nil {
			b.Fatal(err)
		}
		return st
	}
	time.Sleep(200 * time.Millisecond)
	rest := read()
	be := startEngines(b, sock, memPage, memPerEngine, "proc")
	registered := read()
	p := samplePeaks(func() (memSample, error) {
		st, err := readStatus(pid)
		return memSample{status: st}, err
	})
	for i := 0; b.Loop(); i++ {
		memRound(b, be, i)
	}
	peak := p.end().status
	time.Sleep(200 * time.Millisecond)
	after := read()
	for _, e := range be.engines {
		_ = e.Close(context.Background())
	}
	be.engines = nil
	unregistered := read()
	for _, row := range []struct {
		name string
		s    procStatus
	}{{"rest", rest}, {"registered", registered}, {"peak", peak}, {"after", after}, {"unregistered", unregistered}} {
		b.ReportMetric(mib(row.s.VmRSS), row.name+"-rss-MiB")
		b.ReportMetric(mib(row.s.RssAnon), row.name+"-anon-MiB")
		b.Logf("%-12s VmRSS %7.1f MiB  RssAnon %7.1f MiB  RssFile %6.1f MiB  RssShmem %7.1f MiB  VmHWM %7.1f MiB",
			row.name, mib(row.s.VmRSS), mib(row.s.RssAnon), mib(row.s.RssFile), mib(row.s.RssShmem), mib(row.s.VmHWM))
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	<-readDone
	if err := cmd.Wait(); err != nil {
		logMu.Lock()
		defer logMu.Unlock()
		b.Fatalf("kvctl serve exited with %v:\n%s", err, logBuf.String())
	}
}
