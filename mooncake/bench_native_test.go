package mooncake_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// benchSegment is the memory the page-holding process of each pair contributes.
const benchSegment = 512 << 20

// BenchmarkInterop measures kvctl's Native client against Mooncake's own Python client on the
// same real master in the same run. Each pair is two processes: one holds the segment (a
// kvctl helper process / a Python client) and the other, the one timed, has none, so every
// put and get crosses the Transfer Engine over loopback. The Python rows time the loop inside
// the Python process (reported as inproc-ns/op; ns/op adds one driver round trip per run).
//
//	go test -run '^$' -bench BenchmarkInterop -benchtime 200x ./mooncake/
//
// With KVCTL_INTEROP_BUSY=N a sibling process spins N threads on the same cores for the whole
// run (busySibling), so both clients are measured equally loaded.
func BenchmarkInterop(b *testing.B) {
	busyFromEnv(b)
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	startHelper(b, m, "bench-holder", 0, 0, benchSegment)
	kv := newNative(b, m, 0)
	pyHolder := mooncaketest.StartClient(b, m, mooncaketest.ClientOptions{SegmentSize: benchSegment})
	py := mooncaketest.StartClient(b, m, mooncaketest.ClientOptions{LocalBufferSize: 64 << 20})
	_ = pyHolder
	ctx := context.Background()
	run := 0
	for _, size := range []int{64 << 10, 1 << 20} {
		name := fmt.Sprintf("%dKiB", size>>10)
		// Pages stay in the pool for the get rows; a run never stores more than the segment.
		n := func(b *testing.B) int {
			if b.N*size > benchSegment/2 {
				b.Fatalf("%d pages of %d bytes do not fit the %d-byte segment: use a smaller -benchtime", b.N, size, benchSegment)
			}
			return b.N
		}
		run++
		kvPrefix := fmt.Sprintf("kv/%d/%d", run, size)
		pyPrefix := fmt.Sprintf("py/%d/%d", run, size)
		var kvPut, pyPut int
		b.Run("put/"+name+"/kvctl", func(b *testing.B) {
			page := interopPage(kvPrefix, size)
			kvPut = n(b)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if c := kv.BatchPut(ctx, []string{fmt.Sprintf("%s/%d/%d", kvPrefix, b.N, i)}, [][]byte{page}, pool.ReplicateConfig{}); c[0] != pool.OK {
					b.Fatalf("put = %v", c[0])
				}
			}
			kvPrefix = fmt.Sprintf("%s/%d", kvPrefix, b.N)
		})
		b.Run("put/"+name+"/python", func(b *testing.B) {
			pyPut = n(b)
			b.SetBytes(int64(size))
			b.ResetTimer()
			d := py.BenchPut(fmt.Sprintf("%s/%d", pyPrefix, b.N), size, b.N)
			b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "inproc-ns/op")
			pyPrefix = fmt.Sprintf("%s/%d", pyPrefix, b.N)
		})
		b.Run("get/"+name+"/kvctl", func(b *testing.B) {
			dst := make([]byte, size)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key := fmt.Sprintf("%s/%d", kvPrefix, i%kvPut)
				if got := kv.BatchGet(ctx, []string{key}, [][]byte{dst}); got[0] != int64(size) {
					b.Fatalf("get %s = %d", key, got[0])
				}
			}
		})
		b.Run("get/"+name+"/python", func(b *testing.B) {
			if b.N > pyPut {
				b.Skipf("only %d pages stored", pyPut)
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			d := py.BenchGet(pyPrefix, size, b.N)
			b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "inproc-ns/op")
		})
	}
	// Batches of 16 pages of 64 KiB: the paths both clients run in parallel inside one call
	// (kvctl: up to NativeOptions.Transfers transfers at once; Python: put_batch and
	// batch_get_buffer).
	const batch, bsize = 16, 64 << 10
	// Every run puts under keys of its own (a put of an existing key writes nothing); the get
	// rows read the last put run's keys.
	var kvBatches, pyBatches, kvRound, pyRound int
	b.Run("put_batch/16x64KiB/kvctl", func(b *testing.B) {
		if b.N*batch*bsize > benchSegment/2 {
			b.Fatalf("use a smaller -benchtime")
		}
		kvRound++
		kvBatches = b.N
		keys := make([]string, batch)
		bufs := make([][]byte, batch)
		for j := range bufs {
			bufs[j] = interopPage(fmt.Sprint("batch", j), bsize)
		}
		b.SetBytes(batch * bsize)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for j := range keys {
				keys[j] = fmt.Sprintf("kvb/%d/%d/%d", kvRound, i, j)
			}
			for _, c := range kv.BatchPut(ctx, keys, bufs, pool.ReplicateConfig{}) {
				if c != pool.OK {
					b.Fatalf("put = %v", c)
				}
			}
		}
	})
	b.Run("put_batch/16x64KiB/python", func(b *testing.B) {
		if b.N*batch*bsize > benchSegment/2 {
			b.Fatalf("use a smaller -benchtime")
		}
		pyRound++
		pyBatches = b.N
		b.SetBytes(batch * bsize)
		b.ResetTimer()
		d := py.BenchPutBatch(fmt.Sprintf("pyb/%d", pyRound), bsize, b.N, batch)
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "inproc-ns/op")
	})
	b.Run("get_batch/16x64KiB/kvctl", func(b *testing.B) {
		keys := make([]string, batch)
		dst := make([][]byte, batch)
		for j := range dst {
			dst[j] = make([]byte, bsize)
		}
		b.SetBytes(batch * bsize)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for j := range keys {
				keys[j] = fmt.Sprintf("kvb/%d/%d/%d", kvRound, i%kvBatches, j)
			}
			for j, got := range kv.BatchGet(ctx, keys, dst) {
				if got != bsize {
					b.Fatalf("get %s = %d", keys[j], got)
				}
			}
		}
	})
	b.Run("get_batch/16x64KiB/python", func(b *testing.B) {
		if b.N > pyBatches {
			b.Skipf("only %d batches stored", pyBatches)
		}
		b.SetBytes(batch * bsize)
		b.ResetTimer()
		d := py.BenchGetBatch(fmt.Sprintf("pyb/%d", pyRound), bsize, b.N, batch)
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "inproc-ns/op")
	})
	// BatchExistKey of 3,000 keys, half of them present.
	keys := make([]string, 3000)
	for i := range keys {
		keys[i] = fmt.Sprintf("exist/%d", i)
	}
	py.BenchPut("exist", 64, 1500)
	// Two rounds, in both orders, so neither client always finds the leases the other
	// just granted.
	kvExist := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			res := kv.BatchIsExist(ctx, keys)
			if res[0] != 1 || res[2999] != 0 {
				b.Fatalf("BatchIsExist = %d .. %d", res[0], res[2999])
			}
		}
	}
	pyExist := func(b *testing.B) {
		d := py.BenchExist(keys, 1500, b.N)
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "inproc-ns/op")
	}
	b.Run("batch_exist/3000/kvctl", kvExist)
	b.Run("batch_exist/3000/python", pyExist)
	b.Run("batch_exist/3000/python-again", pyExist)
	b.Run("batch_exist/3000/kvctl-again", kvExist)
}

// busyEnv asks BenchmarkInterop for a busy sibling process, and tells that process how many
// threads to spin.
const busyEnv = "KVCTL_INTEROP_BUSY"

// busyFromEnv starts the busy sibling when KVCTL_INTEROP_BUSY names a thread count.
func busyFromEnv(b *testing.B) {
	b.Helper()
	if v := os.Getenv(busyEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1024 {
			b.Fatalf("%s=%q: want a number of threads, 1..1024", busyEnv, v)
		}
		busySibling(b, n)
	}
}

// busySibling starts this test binary again as a process that keeps n threads busy on the same
// cores until the benchmark ends (its stdin closes) or this process dies.
func busySibling(b *testing.B, n int) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBusyProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), busyEnv+"="+strconv.Itoa(n))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	b.Logf("busy sibling process %d spins %d threads", cmd.Process.Pid, n)
}

// TestHelperBusyProcess is the busy sibling of BenchmarkInterop: KVCTL_INTEROP_BUSY threads
// spinning until stdin closes. Skipped in a normal run.
func TestHelperBusyProcess(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv(busyEnv))
	if err != nil || n < 1 {
		t.Skip("helper process only")
	}
	runtime.GOMAXPROCS(n)
	stop := make(chan struct{})
	for range n {
		go func() {
			runtime.LockOSThread()
			x := uint64(1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
				if x == 0 {
					t.Log(x) // keeps the loop from being optimised away
				}
			}
		}()
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	close(stop)
}

// BenchmarkAlternatingInterop measures the rows of BenchmarkInterop with the two clients taking
// turns in short chunks, so that both see the same load. In BenchmarkInterop each client's calls
// run in a window of their own (about half a second), and on a shared host the load that comes
// and goes between two windows moves a row by more than the clients differ (batch_exist/3000
// under KVCTL_INTEROP_BUSY=2: 0.86-1.34x over runs). Here each iteration runs one chunk of calls
// of each client, the first client changing from one iteration to the next; a chunk is a few
// milliseconds of work. kvctl's chunk is timed here, Python's inside the Python process (the
// request to the driver and its reply are left out). Every sub-benchmark reports both clients'
// mean time per call and the ratio python-ns/call over kvctl-ns/call (above 1 when kvctl is
// faster).
//
// The setup is BenchmarkInterop's: one process holds the segment for each client (a kvctl helper
// process, a Python client, 512 MiB each) and the timed client has none, so every transfer
// crosses the Transfer Engine over loopback. Puts go under keys not used before (a put of an
// existing key writes nothing) and stay stored; a run that would store more than half of the two
// segments fails. Gets read values stored before the timing starts and check their sizes;
// BatchIsExist checks the first and last of 3,000 results (1,500 keys present) on both sides.
//
//	go test -run '^$' -bench BenchmarkAlternatingInterop -benchtime 20x ./mooncake/
//
// KVCTL_INTEROP_BUSY=N adds the busy sibling process, as for BenchmarkInterop.
func BenchmarkAlternatingInterop(b *testing.B) {
	busyFromEnv(b)
	m := mooncaketest.StartMaster(b, mooncaketest.MasterOptions{})
	startHelper(b, m, "bench-holder", 0, 0, benchSegment)
	kv := newNative(b, m, 0)
	_ = mooncaketest.StartClient(b, m, mooncaketest.ClientOptions{SegmentSize: benchSegment}) // holds Python's values
	py := mooncaketest.StartClient(b, m, mooncaketest.ClientOptions{LocalBufferSize: 64 << 20})
	ctx := context.Background()

	// stored counts the bytes both clients have put; it stays below half the two segments, well
	// clear of the master's eviction.
	var stored int
	store := func(b *testing.B, n int) {
		b.Helper()
		if stored+n > benchSegment {
			b.Fatalf("this run would store %d bytes in all, more than the %d allowed (half of the two %d-byte segments): use a smaller -benchtime",
				stored+n, benchSegment, benchSegment)
		}
		stored += n
	}
	kvPut := func(b *testing.B, keys []string, bufs [][]byte) {
		b.Helper()
		for _, c := range kv.BatchPut(ctx, keys, bufs, pool.ReplicateConfig{}) {
			if c != pool.OK {
				b.Fatalf("kvctl put %s..: %v", keys[0], c)
			}
		}
	}
	kvGet := func(b *testing.B, keys []string, bufs [][]byte, size int) {
		b.Helper()
		for j, got := range kv.BatchGet(ctx, keys, bufs) {
			if got != int64(size) {
				b.Fatalf("kvctl get %s = %d, want %d bytes", keys[j], got, size)
			}
		}
	}
	// round numbers the chunks of every put row, so that no two chunks share a key.
	round := 0

	for _, r := range []struct {
		size, chunk int
	}{{64 << 10, 32}, {1 << 20, 4}} {
		size, chunk := r.size, r.chunk
		name := fmt.Sprintf("%dKiB", size>>10)
		page := interopPage("alt", size)
		b.Run("put/"+name, func(b *testing.B) {
			store(b, 2*b.N*chunk*size)
			takeTurns(b, chunk, func() {
				round++
				for i := range chunk {
					kvPut(b, []string{fmt.Sprintf("kvp/%d/%d/%d", size, round, i)}, [][]byte{page})
				}
			}, func() time.Duration {
				round++
				return py.BenchPut(fmt.Sprintf("pyp/%d/%d", size, round), size, chunk)
			})
		})
		// The get rows read chunk values each client stored before the timing, the same ones
		// in every chunk.
		ready := false
		b.Run("get/"+name, func(b *testing.B) {
			if !ready {
				store(b, 2*chunk*size)
				for i := range chunk {
					kvPut(b, []string{fmt.Sprintf("kvg/%d/%d", size, i)}, [][]byte{page})
				}
				py.BenchPut(fmt.Sprintf("pyg/%d", size), size, chunk)
				ready = true
			}
			dst := make([]byte, size)
			takeTurns(b, chunk, func() {
				for i := range chunk {
					kvGet(b, []string{fmt.Sprintf("kvg/%d/%d", size, i)}, [][]byte{dst}, size)
				}
			}, func() time.Duration {
				return py.BenchGet(fmt.Sprintf("pyg/%d", size), size, chunk)
			})
		})
	}

	// Batches of 16 pages of 64 KiB, keys prefix/i/j for call i and page j on both sides.
	const batch, bsize, bchunk = 16, 64 << 10, 3
	bufs := make([][]byte, batch)
	for j := range bufs {
		bufs[j] = interopPage(fmt.Sprint("alt-batch", j), bsize)
	}
	keys := make([]string, batch)
	kvBatches := func(prefix string, do func()) {
		for i := range bchunk {
			for j := range keys {
				keys[j] = fmt.Sprintf("%s/%d/%d", prefix, i, j)
			}
			do()
		}
	}
	b.Run("put_batch/16x64KiB", func(b *testing.B) {
		store(b, 2*b.N*bchunk*batch*bsize)
		takeTurns(b, bchunk, func() {
			round++
			kvBatches(fmt.Sprintf("kvpb/%d", round), func() { kvPut(b, keys, bufs) })
		}, func() time.Duration {
			round++
			return py.BenchPutBatch(fmt.Sprintf("pypb/%d", round), bsize, bchunk, batch)
		})
	})
	ready := false
	b.Run("get_batch/16x64KiB", func(b *testing.B) {
		if !ready {
			store(b, 2*bchunk*batch*bsize)
			kvBatches("kvgb", func() { kvPut(b, keys, bufs) })
			py.BenchPutBatch("pygb", bsize, bchunk, batch)
			ready = true
		}
		dst := make([][]byte, batch)
		for j := range dst {
			dst[j] = make([]byte, bsize)
		}
		takeTurns(b, bchunk, func() {
			kvBatches("kvgb", func() { kvGet(b, keys, dst, bsize) })
		}, func() time.Duration {
			return py.BenchGetBatch("pygb", bsize, bchunk, batch)
		})
	})

	// BatchIsExist of 3,000 keys, the first 1,500 present; an existence check grants read
	// leases, and each client sees those the other just granted in every other chunk.
	const present = 1500
	existKeys := make([]string, 2*present)
	for i := range existKeys {
		existKeys[i] = fmt.Sprintf("exist/%d", i)
	}
	existReady := false
	b.Run("batch_exist/3000", func(b *testing.B) {
		if !existReady {
			py.BenchPut("exist", 64, present)
			existReady = true
		}
		const chunk = 10
		takeTurns(b, chunk, func() {
			for range chunk {
				if res := kv.BatchIsExist(ctx, existKeys); res[0] != 1 || res[len(res)-1] != 0 {
					b.Fatalf("kvctl BatchIsExist = %d .. %d, want 1 .. 0", res[0], res[len(res)-1])
				}
			}
		}, func() time.Duration {
			return py.BenchExist(existKeys, present, chunk)
		})
	})
}

// takeTurns runs b.N iterations of one chunk of kvctl's calls (kv, timed here) and one chunk of
// Python's (py, which returns the time its loop took inside the Python process), kvctl first in
// even iterations and Python first in odd ones, and reports the mean time of one call of each
// and the ratio of the two.
func takeTurns(b *testing.B, chunk int, kv func(), py func() time.Duration) {
	b.Helper()
	var kvTime, pyTime time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 1 {
			pyTime += py()
		}
		start := time.Now()
		kv()
		kvTime += time.Since(start)
		if i%2 == 0 {
			pyTime += py()
		}
	}
	calls := float64(b.N * chunk)
	b.ReportMetric(float64(kvTime.Nanoseconds())/calls, "kvctl-ns/call")
	b.ReportMetric(float64(pyTime.Nanoseconds())/calls, "python-ns/call")
	b.ReportMetric(float64(pyTime)/float64(kvTime), "python/kvctl")
}
