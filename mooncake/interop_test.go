package mooncake_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

var interopSizes = []int{1 << 10, 1 << 20, 16 << 20}

// interopPage returns n bytes that differ per key and per position, with every byte value
// present, so a shifted, truncated or mixed-up transfer cannot compare equal.
func interopPage(key string, n int) []byte {
	b := make([]byte, n)
	var h uint64 = 14695981039346656037
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 1099511628211
	}
	for i := range b {
		h ^= h << 13
		h ^= h >> 7
		h ^= h << 17
		b[i] = byte(h)
	}
	return b
}

// TestInteropPythonWritesKvctlReads: Mooncake's Python client puts pages into its own
// segment; kvctl (Native, no segment of its own, so every byte crosses the Transfer Engine)
// reads them byte for byte.
func TestInteropPythonWritesKvctlReads(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20})
	n := newNative(t, m, 0)
	for _, size := range interopSizes {
		key := fmt.Sprintf("py-to-kvctl/%d", size)
		want := interopPage(key, size)
		if rc := py.Put(key, want, mooncaketest.PutOptions{}); rc != 0 {
			t.Fatalf("python put %s = %d", key, rc)
		}
		if got := n.BatchIsExist(context.Background(), []string{key}); got[0] != 1 {
			t.Fatalf("kvctl BatchIsExist %s = %d", key, got[0])
		}
		dst := bytes.Repeat([]byte{0xAA}, size+7)
		got := n.BatchGet(context.Background(), []string{key}, [][]byte{dst})
		if got[0] != int64(size) {
			t.Fatalf("kvctl BatchGet %s = %d, want %d", key, got[0], size)
		}
		if !bytes.Equal(dst[:size], want) {
			t.Fatalf("kvctl read different bytes for %s", key)
		}
		if !bytes.Equal(dst[size:], bytes.Repeat([]byte{0xAA}, 7)) {
			t.Fatalf("kvctl wrote past the object's %d bytes", size)
		}
	}
}

// TestInteropKvctlWritesPythonReads: kvctl puts pages; Mooncake's Python client reads them
// byte for byte, both when the master placed them in kvctl's own segment (the Python client
// reads them from kvctl's Transfer Engine server) and when kvctl wrote them into the Python
// client's segment over the Transfer Engine.
func TestInteropKvctlWritesPythonReads(t *testing.T) {
	t.Run("FromKvctlSegment", func(t *testing.T) {
		m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
		n := newNative(t, m, 64<<20)
		py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{})
		kvctlToPython(t, n, py, "seg")
	})
	t.Run("IntoPythonSegment", func(t *testing.T) {
		m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
		py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20})
		n := newNative(t, m, 0)
		kvctlToPython(t, n, py, "te")
	})
}

func kvctlToPython(t *testing.T, n *mooncake.Native, py *mooncaketest.PyClient, tag string) {
	t.Helper()
	for _, size := range interopSizes {
		key := fmt.Sprintf("kvctl-to-py/%s/%d", tag, size)
		want := interopPage(key, size)
		if c := n.BatchPut(context.Background(), []string{key}, [][]byte{want}, pool.ReplicateConfig{}); c[0] != pool.OK {
			t.Fatalf("kvctl put %s = %v", key, c[0])
		}
		if got := py.BatchIsExist([]string{key}); len(got) != 1 || got[0] != 1 {
			t.Fatalf("python batch_is_exist %s = %v", key, got)
		}
		if got := py.Get(key); !bytes.Equal(got, want) {
			t.Fatalf("python read %d bytes for %s, not the %d kvctl put", len(got), key, size)
		}
	}
}

// TestInteropExistRemoveAcrossClients: existence and removal agree between the two clients,
// including the master's read-lease rule on Remove.
func TestInteropExistRemoveAcrossClients(t *testing.T) {
	// A lease long enough that a loaded machine cannot let it lapse between the Python get
	// and kvctl's Remove.
	const lease = 2 * time.Second
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{LeaseTTL: lease})
	py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 16 << 20})
	n := newNative(t, m, 16<<20)
	ctx := context.Background()
	py.Put("x/py", interopPage("x/py", 100), mooncaketest.PutOptions{})
	n.BatchPut(ctx, []string{"x/kv"}, [][]byte{interopPage("x/kv", 100)}, pool.ReplicateConfig{})
	keys := []string{"x/py", "x/none", "x/kv"}
	if got := fmt.Sprint(n.BatchIsExist(ctx, keys)); got != "[1 0 1]" {
		t.Fatalf("kvctl BatchIsExist = %s", got)
	}
	if got := fmt.Sprint(py.BatchIsExist(keys)); got != "[1 0 1]" {
		t.Fatalf("python batch_is_exist = %s", got)
	}
	// The Python get grants a read lease: kvctl's plain Remove is refused until it lapses.
	py.Get("x/kv")
	if c := n.Remove(ctx, "x/kv", false); c != pool.ErrObjectHasLease {
		t.Fatalf("kvctl Remove under a read lease = %v", c)
	}
	time.Sleep(lease + 200*time.Millisecond)
	if c := n.Remove(ctx, "x/kv", false); c != pool.OK {
		t.Fatalf("kvctl Remove after the lease = %v", c)
	}
	if rc := py.Remove("x/py", true); rc != 0 {
		t.Fatalf("python remove = %d", rc)
	}
	if got := fmt.Sprint(n.BatchIsExist(ctx, keys)); got != "[0 0 0]" {
		t.Fatalf("after both removes kvctl BatchIsExist = %s", got)
	}
}

const helperEnv = "KVCTL_NATIVE_HELPER"

// TestHelperNativeProcess is not a test: run by TestTwoKvctlProcesses in a process of its
// own, it mounts a segment on the master named by the environment, puts the pages it is
// told to, reports "ready" and serves its segment until stdin closes.
func TestHelperNativeProcess(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("helper process only")
	}
	var rpcAddr, metaURL, prefix string
	var count, size int
	var segment int64
	if _, err := fmt.Sscanf(spec, "%s %s %s %d %d %d", &rpcAddr, &metaURL, &prefix, &count, &size, &segment); err != nil {
		t.Fatalf("bad %s %q: %v", helperEnv, spec, err)
	}
	n, err := mooncake.NewNative(context.Background(), mooncake.NativeOptions{MasterAddr: rpcAddr, MetadataURL: metaURL, SegmentSize: segment})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for i := 0; i < count; i++ {
		key := fmt.Sprintf("%s/%d", prefix, i)
		if c := n.BatchPut(context.Background(), []string{key}, [][]byte{interopPage(key, size)}, pool.ReplicateConfig{}); c[0] != pool.OK {
			t.Fatalf("put %s = %v", key, c[0])
		}
	}
	fmt.Printf("ready %s\n", n.SegmentName())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startHelper runs TestHelperNativeProcess in a child process and waits for it to be ready.
func startHelper(t testing.TB, m *mooncaketest.Master, prefix string, count, size int, segSize int64) (segment string, kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperNativeProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s %d %d %d", helperEnv, m.RPCAddr, m.MetadataURL, prefix, count, size, segSize))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	kill = func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	}
	t.Cleanup(func() { _ = stdin.Close(); kill() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("helper process did not get ready (%q, %v):\n%s", line, err, stderr.String())
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "ready ")), kill
}

// TestTwoKvctlProcesses: two Native clients in separate processes, each with its own segment,
// on one master. Pages the other process put are read here byte for byte, and those that
// the master placed in the other process's segment crossed the Transfer Engine between the
// two processes.
func TestTwoKvctlProcesses(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	const count, size = 24, 256 << 10
	// This process's segment is too small for any page, so the master places them all in
	// the helper's segment.
	n := newNative(t, m, 64<<10)
	other, _ := startHelper(t, m, "two", count, size, count*size+1<<20)
	if other == n.SegmentName() {
		t.Fatalf("both processes named their segment %s", other)
	}
	ctx := context.Background()
	for i := 0; i < count; i++ {
		key := fmt.Sprintf("two/%d", i)
		dst := make([]byte, size)
		if got := n.BatchGet(ctx, []string{key}, [][]byte{dst}); got[0] != size {
			t.Fatalf("get %s = %d", key, got[0])
		}
		if !bytes.Equal(dst, interopPage(key, size)) {
			t.Fatalf("%s: different bytes from the other process", key)
		}
	}
	segs, err := n.Segments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var otherUsed int64
	for _, s := range segs {
		if s.Name == other {
			otherUsed = s.Used
		}
	}
	if otherUsed != count*size {
		t.Fatalf("the other process's segment holds %d bytes, want all %d pages (%v)", otherUsed, count*size, segs)
	}
	if st, _ := n.Stats(ctx); st.BytesOut != count*size {
		t.Fatalf("bytes_out = %d, want %d", st.BytesOut, count*size)
	}
}
