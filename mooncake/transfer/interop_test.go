package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/transfer"
)

// interopSizes are the transfer sizes proven against the real engine: a small page, the TCP
// slice size, a 1 MiB page, and an odd 16 MiB+ page that ends mid-slice.
var interopSizes = []int{1 << 10, 64 << 10, 1 << 20, 16<<20 + 4099}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func uniqueName(prefix string) string {
	return fmt.Sprintf("127.0.0.1:%s-%d", prefix, time.Now().UnixNano()%1e9)
}

// A real Python TransferEngine registers memory; kvctl finds it through the metadata the engine
// published, reads what the engine holds and writes what the engine then sees, byte for byte.
func TestInteropKvctlClientAgainstPythonEngine(t *testing.T) {
	metaURL := startMaster(t)
	const bufSize = 40 << 20
	py := startPyPeer(t, metaURL, uniqueName("py"), bufSize)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	meta, err := transfer.NewMetadataClient(metaURL, transfer.MetadataOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := meta.Resolve(ctx, py.Name)
	if err != nil {
		t.Fatalf("resolve the engine's segment: %v", err)
	}
	if ep.ProtoVersion != 2 {
		t.Errorf("engine advertises tcp_proto_version %d, the pinned wheel writes 2", ep.ProtoVersion)
	}
	if !ep.Segment.Contains(py.Base, bufSize) {
		t.Fatalf("descriptor buffers %+v do not hold the registered buffer %#x+%d", ep.Segment.Buffers, py.Base, bufSize)
	}

	cl := transfer.NewClient(transfer.ClientOptions{})
	defer cl.Close()
	for i, n := range interopSizes {
		t.Run(fmt.Sprintf("read_%d", n), func(t *testing.T) {
			want := randomBytes(uint64(i+1), n)
			py.fill(t, 0, want)
			got := make([]byte, n)
			if err := cl.Read(ctx, ep.Addr, py.Base, got); err != nil {
				t.Fatalf("read %d bytes from the engine: %v", n, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes: first difference at %d", n, firstDiff(got, want))
			}
		})
		t.Run(fmt.Sprintf("write_%d", n), func(t *testing.T) {
			want := randomBytes(uint64(100+i), n)
			off := 8 << 20
			if err := cl.Write(ctx, ep.Addr, py.Base+uint64(off), want); err != nil {
				t.Fatalf("write %d bytes to the engine: %v", n, err)
			}
			got := py.dump(t, off, n)
			if !bytes.Equal(got, want) {
				t.Fatalf("engine holds different bytes after a %d-byte write: first difference at %d", n, firstDiff(got, want))
			}
		})
	}

	t.Run("refused", func(t *testing.T) {
		// Ends 90 bytes past the registered buffer: the real target refuses with status 1.
		addr := py.Base + bufSize - 10
		err := cl.Read(ctx, ep.Addr, addr, make([]byte, 100))
		var refused *transfer.RefusedError
		if !errors.As(err, &refused) || !errors.Is(err, transfer.ErrRefused) {
			t.Fatalf("out-of-range read: got %v, want a RefusedError", err)
		}
		if refused.Status != transfer.StatusAddrRejected || refused.Addr != addr || refused.Size != 100 {
			t.Errorf("refusal %+v: want status 1 at %#x size 100", refused, addr)
		}
		for _, part := range []string{fmt.Sprintf("%#x", addr), "100 bytes", ep.Addr} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("error %q does not name %q", err, part)
			}
		}
		err = cl.Write(ctx, ep.Addr, addr, make([]byte, 100))
		if !errors.As(err, &refused) {
			t.Fatalf("out-of-range write: got %v, want a RefusedError", err)
		}
		// The engine keeps serving.
		want := randomBytes(7, 4096)
		py.fill(t, 0, want)
		got := make([]byte, len(want))
		if err := cl.Read(ctx, ep.Addr, py.Base, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read after refusals: %v", err)
		}
	})
}

// A real Python TransferEngine finds kvctl's segment through the metadata kvctl published and
// reads from and writes to kvctl's server byte for byte; it is refused outside the segment.
func TestInteropPythonEngineAgainstKvctlServer(t *testing.T) {
	metaURL := startMaster(t)
	const (
		segSize = 40 << 20
		base    = uint64(0x7e5500000000)
	)
	srv, err := transfer.NewServer(transfer.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	mem := randomBytes(42, segSize)
	if err := srv.Register(base, mem); err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve() }()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	meta, err := transfer.NewMetadataClient(metaURL, transfer.MetadataOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName("kvctl")
	desc := transfer.SegmentDesc{
		Name: name, Protocol: transfer.ProtocolTCP, TCPDataPort: srv.Port(),
		Buffers: []transfer.BufferDesc{{Name: name, Addr: base, Length: segSize}},
	}
	if err := meta.PublishSegment(ctx, desc, "127.0.0.1", srv.Port()); err != nil {
		t.Fatal(err)
	}

	py := startPyPeer(t, metaURL, uniqueName("py"), segSize)
	for i, n := range interopSizes {
		t.Run(fmt.Sprintf("engine_reads_%d", n), func(t *testing.T) {
			off := uint64(i) * 4096
			if rc := py.transfer(t, "read", name, 0, base+off, n); rc != 0 {
				t.Fatalf("engine read of %d bytes returned %d", n, rc)
			}
			got := py.dump(t, 0, n)
			if want := mem[off : off+uint64(n)]; !bytes.Equal(got, want) {
				t.Fatalf("engine read %d bytes: first difference at %d", n, firstDiff(got, want))
			}
		})
		t.Run(fmt.Sprintf("engine_writes_%d", n), func(t *testing.T) {
			want := randomBytes(uint64(200+i), n)
			py.fill(t, 0, want)
			addr := base + 20<<20 + uint64(i)
			if rc := py.transfer(t, "write", name, 0, addr, n); rc != 0 {
				t.Fatalf("engine write of %d bytes returned %d", n, rc)
			}
			got := make([]byte, n)
			if err := srv.ReadAt(addr, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("kvctl holds different bytes after the engine's %d-byte write: first difference at %d", n, firstDiff(got, want))
			}
		})
	}

	t.Run("engine_refused", func(t *testing.T) {
		before := srv.Stats().Refused
		if rc := py.transfer(t, "read", name, 0, base+segSize-16, 64); rc == 0 {
			t.Fatal("engine read past kvctl's segment succeeded")
		}
		if got := srv.Stats().Refused; got <= before {
			t.Errorf("server refused %d requests, want more than %d", got, before)
		}
		if rc := py.transfer(t, "read", name, 0, base, 4096); rc != 0 {
			t.Fatalf("engine read after a refusal returned %d", rc)
		}
		if got := py.dump(t, 0, 4096); !bytes.Equal(got, mem[:4096]) {
			t.Fatal("engine read after a refusal returned different bytes")
		}
	})

	// The engine's legacy framing (MC_TCP_PROTO=1: no status frames) against kvctl's server.
	t.Run("engine_v1_framing", func(t *testing.T) {
		v1 := startPyPeer(t, metaURL, uniqueName("pyv1"), segSize, "MC_TCP_PROTO=1")
		before := srv.Stats()
		for i, n := range []int{64 << 10, 1 << 20} {
			addr := base + 30<<20 + uint64(i)*(2<<20)
			want := randomBytes(uint64(300+i), n)
			v1.fill(t, 0, want)
			if rc := v1.transfer(t, "write", name, 0, addr, n); rc != 0 {
				t.Fatalf("v1 write of %d bytes returned %d", n, rc)
			}
			// v1 has no acknowledgement: the engine reports completion once the bytes are in
			// its socket, possibly before kvctl applied them. They must arrive whole.
			got := make([]byte, n)
			waitFor(t, fmt.Sprintf("the v1 write of %d bytes to be applied", n), func() bool {
				return srv.ReadAt(addr, got) == nil && bytes.Equal(got, want)
			})
			if rc := v1.transfer(t, "read", name, 4096, addr, n); rc != 0 {
				t.Fatalf("v1 read of %d bytes returned %d", n, rc)
			}
			if got := v1.dump(t, 4096, n); !bytes.Equal(got, want) {
				t.Fatalf("v1 read of %d bytes: first difference at %d", n, firstDiff(got, want))
			}
		}
		// A READ is counted once its reply is sent, possibly just after the engine has the bytes.
		waitFor(t, "2 writes, 2 reads and 4 requests under v1 framing counted", func() bool {
			after := srv.Stats()
			return after.Writes-before.Writes == 2 && after.Reads-before.Reads == 2 && after.V1Requests-before.V1Requests == 4
		})
		// A v1 initiator learns of a refusal only from the close; it must not report success.
		if rc := v1.transfer(t, "read", name, 0, base+segSize-16, 64); rc == 0 {
			t.Fatal("v1 engine read past kvctl's segment succeeded")
		}
	})

	if err := meta.RemoveSegment(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := meta.GetSegment(ctx, name); !errors.Is(err, transfer.ErrNotFound) {
		t.Fatalf("descriptor after RemoveSegment: %v, want ErrNotFound", err)
	}
}

// The metadata client stores, reads and deletes keys on the real master's HTTP metadata server
// and decodes the descriptor the real engine publishes.
func TestMetadataAgainstRealMaster(t *testing.T) {
	metaURL := startMaster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	meta, err := transfer.NewMetadataClient(strings.TrimSuffix(metaURL, "/metadata"), transfer.MetadataOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if meta.Endpoint() != metaURL {
		t.Errorf("endpoint %q, want %q", meta.Endpoint(), metaURL)
	}
	key := "kvctl/test key/with?odd&chars=1"
	if _, err := meta.Get(ctx, key); !errors.Is(err, transfer.ErrNotFound) {
		t.Fatalf("get of a missing key: %v, want ErrNotFound", err)
	}
	if err := meta.Put(ctx, key, []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	got, err := meta.Get(ctx, key)
	if err != nil || string(got) != `{"a":1}` {
		t.Fatalf("get after put: %q, %v", got, err)
	}
	if err := meta.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := meta.Get(ctx, key); !errors.Is(err, transfer.ErrNotFound) {
		t.Fatalf("get after delete: %v, want ErrNotFound", err)
	}
	if err := meta.Delete(ctx, key); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}

	py := startPyPeer(t, metaURL, uniqueName("py"), 1<<20)
	d, err := meta.GetSegment(ctx, py.Name)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != py.Name || d.Protocol != "tcp" || d.TCPDataPort == 0 || d.TCPProtoVersion != 2 || d.TCPDataHost != "127.0.0.1" {
		t.Errorf("engine descriptor decoded as %+v", d)
	}
	if !d.Contains(py.Base, 1<<20) {
		t.Errorf("engine descriptor buffers %+v lack %#x+1MiB", d.Buffers, py.Base)
	}
	// What kvctl encodes, the engine's own decoder must accept: proven by the interop tests;
	// here the round trip through the server keeps every field.
	mine := transfer.SegmentDesc{Name: "kvctl-rt", Protocol: "tcp", TCPDataPort: 4242, TCPDataHost: "127.0.0.1",
		Buffers: []transfer.BufferDesc{{Name: "kvctl-rt", Addr: 1 << 40, Length: 1 << 30}}}
	if err := meta.PublishSegment(ctx, mine, "127.0.0.1", 4242); err != nil {
		t.Fatal(err)
	}
	back, err := meta.GetSegment(ctx, "kvctl-rt")
	if err != nil {
		t.Fatal(err)
	}
	if back.TCPDataPort != 4242 || back.TCPProtoVersion != 2 || len(back.Buffers) != 1 || back.Buffers[0] != mine.Buffers[0] {
		t.Errorf("published descriptor read back as %+v", back)
	}
	ep, err := meta.Resolve(ctx, "kvctl-rt")
	if err != nil || ep.Addr != "127.0.0.1:4242" {
		t.Errorf("resolve: %+v, %v", ep, err)
	}
	if err := meta.RemoveSegment(ctx, "kvctl-rt"); err != nil {
		t.Fatal(err)
	}
	if _, err := meta.Get(ctx, transfer.RPCMetaKey("kvctl-rt")); !errors.Is(err, transfer.ErrNotFound) {
		t.Errorf("rpc_meta after remove: %v", err)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
