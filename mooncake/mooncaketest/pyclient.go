package mooncaketest

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

//go:embed testdata/mcclient.py
var clientScript []byte

// ClientOptions configure a Python store client.
type ClientOptions struct {
	// SegmentSize is the memory the client mounts into the pool (global_segment_size);
	// 0 mounts none, so the client only reads and writes other segments.
	SegmentSize int64
	// LocalBufferSize is the client's registered transfer buffer (default 64 MiB).
	LocalBufferSize int64
	// Hostname is the client's local_hostname, which also names its segment (default
	// 127.0.0.1; the store appends its own port).
	Hostname string
	// Env adds environment variables to the client's (e.g. MOONCAKE_STORE_CHECKSUM=1).
	Env []string
}

// PutOptions are the ReplicateConfig fields a Python put may set.
type PutOptions struct {
	SoftPin bool
	TTL     time.Duration // soft_pin_ttl_ms; only with SoftPin
	HardPin bool
	Group   string
}

// PyClient is Mooncake's own Python store client (MooncakeDistributedStore, TCP protocol) in
// a process of its own, driven one request at a time. It stays alive, its segment mounted,
// until Kill or Close or the end of the test.
type PyClient struct {
	t   testing.TB
	dir string
	cmd *exec.Cmd
	log *lockedBuffer

	mu   sync.Mutex
	enc  *json.Encoder
	dec  *json.Decoder
	done chan struct{}
	seq  int
}

type pyReply struct {
	Op      string  `json:"op"`
	RC      int     `json:"rc"`
	Size    int64   `json:"size"`
	Results []int   `json:"results"`
	NS      float64 `json:"ns"`
	Error   string  `json:"error"`
}

// StartClient starts a Python store client against m and waits until its setup returned.
// The process is killed by t.Cleanup; its log goes to the test log when the test failed.
func StartClient(t testing.TB, m *Master, opts ClientOptions) *PyClient {
	t.Helper()
	env := PyEnv(t)
	if opts.LocalBufferSize == 0 {
		opts.LocalBufferSize = 64 << 20
	}
	if opts.Hostname == "" {
		opts.Hostname = "127.0.0.1"
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "mcclient.py")
	if err := os.WriteFile(script, clientScript, 0o600); err != nil {
		t.Fatal(err)
	}
	replyR, replyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// No context: t.Context() ends before the cleanups registered after this one run, and the
	// client's segment must stay mounted for them; Kill ends the process from t.Cleanup.
	cmd := exec.Command(filepath.Join(env, "bin", "python3"), script, opts.Hostname, m.MetadataURL, m.RPCAddr, //nolint:noctx // Kill ends it (see above)
		strconv.FormatInt(opts.SegmentSize, 10), strconv.FormatInt(opts.LocalBufferSize, 10))
	cmd.Env = append(append(os.Environ(), "MC_TCP_BIND_ADDRESS=127.0.0.1", "PYTHONUNBUFFERED=1"), opts.Env...)
	c := &PyClient{t: t, dir: dir, cmd: cmd, log: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout = c.log
	cmd.Stderr = c.log
	cmd.ExtraFiles = []*os.File{replyW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start python store client: %v", err)
	}
	_ = replyW.Close()
	go func() { _ = cmd.Wait(); _ = replyR.Close(); close(c.done) }()
	t.Cleanup(func() {
		c.Kill()
		if t.Failed() {
			t.Logf("python store client log:\n%s", c.log.String())
		}
	})
	c.enc = json.NewEncoder(stdin)
	c.dec = json.NewDecoder(bufio.NewReader(replyR))
	var rep pyReply
	if err := c.dec.Decode(&rep); err != nil || rep.RC != 0 {
		t.Fatalf("python store client setup failed (rc %d, %v):\n%s", rep.RC, err, c.log.String())
	}
	return c
}

func (c *PyClient) call(req map[string]any) (pyReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rep pyReply
	if err := c.enc.Encode(req); err != nil {
		return rep, fmt.Errorf("python store client: %w", err)
	}
	if err := c.dec.Decode(&rep); err != nil {
		return rep, fmt.Errorf("python store client gave no reply to %v: %w", req["op"], err)
	}
	if rep.Error != "" {
		return rep, errors.New("python store client: " + rep.Error)
	}
	return rep, nil
}

func (c *PyClient) must(req map[string]any) pyReply {
	c.t.Helper()
	rep, err := c.call(req)
	if err != nil {
		c.t.Fatalf("%v\nlog:\n%s", err, c.log.String())
	}
	return rep
}

func (c *PyClient) file() string {
	c.mu.Lock()
	c.seq++
	n := c.seq
	c.mu.Unlock()
	return filepath.Join(c.dir, "value-"+strconv.Itoa(n))
}

// Put stores value under key with MooncakeDistributedStore.put and returns its result code
// (0 on success, also when the key already existed).
func (c *PyClient) Put(key string, value []byte, o PutOptions) int {
	c.t.Helper()
	f := c.file()
	if err := os.WriteFile(f, value, 0o600); err != nil {
		c.t.Fatal(err)
	}
	defer func() { _ = os.Remove(f) }()
	return c.must(map[string]any{"op": "put", "key": key, "file": f, "soft_pin": o.SoftPin,
		"ttl_ms": o.TTL.Milliseconds(), "hard_pin": o.HardPin, "group": o.Group}).RC
}

// Get reads key with MooncakeDistributedStore.get; a miss or a failed read returns no bytes.
func (c *PyClient) Get(key string) []byte {
	c.t.Helper()
	f := c.file()
	defer func() { _ = os.Remove(f) }()
	rep := c.must(map[string]any{"op": "get", "key": key, "file": f})
	b, err := os.ReadFile(f)
	if err != nil {
		c.t.Fatal(err)
	}
	if int64(len(b)) != rep.Size {
		c.t.Fatalf("python get %q: file holds %d bytes, reply says %d", key, len(b), rep.Size)
	}
	return b
}

// IsExist is MooncakeDistributedStore.is_exist: 1 present, 0 absent, negative on error.
func (c *PyClient) IsExist(key string) int {
	c.t.Helper()
	return c.must(map[string]any{"op": "is_exist", "key": key}).RC
}

// BatchIsExist is MooncakeDistributedStore.batch_is_exist.
func (c *PyClient) BatchIsExist(keys []string) []int {
	c.t.Helper()
	return c.must(map[string]any{"op": "batch_is_exist", "keys": keys}).Results
}

// Remove is MooncakeDistributedStore.remove.
func (c *PyClient) Remove(key string, force bool) int {
	c.t.Helper()
	return c.must(map[string]any{"op": "remove", "key": key, "force": force}).RC
}

// BenchPut puts n values of size bytes under prefix/0..n-1 inside the Python process and
// returns the time the loop took there, so process start-up and this driver's pipe are not
// counted.
func (c *PyClient) BenchPut(prefix string, size, n int) time.Duration {
	c.t.Helper()
	rep := c.must(map[string]any{"op": "bench_put", "prefix": prefix, "size": size, "n": n})
	if rep.RC != 0 {
		c.t.Fatalf("python bench_put: %d puts failed", -rep.RC)
	}
	return time.Duration(rep.NS)
}

// BenchGet gets prefix/0..n-1 (each of size bytes) inside the Python process and returns the
// time the loop took there.
func (c *PyClient) BenchGet(prefix string, size, n int) time.Duration {
	c.t.Helper()
	rep := c.must(map[string]any{"op": "bench_get", "prefix": prefix, "size": size, "n": n})
	if rep.RC != 0 {
		c.t.Fatalf("python bench_get: %d gets returned the wrong size", -rep.RC)
	}
	return time.Duration(rep.NS)
}

// BenchPutBatch runs n put_batch calls of batch values of size bytes each, under keys
// prefix/i/j, inside the Python process and returns the time the loop took there.
func (c *PyClient) BenchPutBatch(prefix string, size, n, batch int) time.Duration {
	c.t.Helper()
	rep := c.must(map[string]any{"op": "bench_put_batch", "prefix": prefix, "size": size, "n": n, "batch": batch})
	if rep.RC != 0 {
		c.t.Fatalf("python bench_put_batch: %d batches failed", -rep.RC)
	}
	return time.Duration(rep.NS)
}

// BenchGetBatch runs n batch_get_buffer calls over the keys BenchPutBatch stored and returns
// the time the loop took inside the Python process.
func (c *PyClient) BenchGetBatch(prefix string, size, n, batch int) time.Duration {
	c.t.Helper()
	rep := c.must(map[string]any{"op": "bench_get_batch", "prefix": prefix, "size": size, "n": n, "batch": batch})
	if rep.RC != 0 {
		c.t.Fatalf("python bench_get_batch: %d values missing or of the wrong size", -rep.RC)
	}
	return time.Duration(rep.NS)
}

// BenchExist calls batch_is_exist(keys) n times inside the Python process and returns the
// time the loop took there. keys[:present] are expected to exist and the rest not: each
// call's first and last results are checked, and a mismatch fails the test.
func (c *PyClient) BenchExist(keys []string, present, n int) time.Duration {
	c.t.Helper()
	rep := c.must(map[string]any{"op": "bench_exist", "keys": keys, "present": present, "n": n})
	if rep.RC != 0 {
		c.t.Fatalf("python bench_exist: %d calls gave the wrong first or last result", -rep.RC)
	}
	return time.Duration(rep.NS)
}

// Close asks the client to unmount and exit, and waits for it.
func (c *PyClient) Close() {
	_, _ = c.call(map[string]any{"op": "quit"})
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.Kill()
	}
}

// Kill ends the client with SIGKILL, as a crashed segment owner, and waits for it.
func (c *PyClient) Kill() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	<-c.done
}

// Log returns what the client process has logged so far.
func (c *PyClient) Log() string { return c.log.String() }
