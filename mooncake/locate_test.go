package mooncake_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/pool"
)

// replicaListCalls reads the master's count of BatchGetReplicaList calls.
func replicaListCalls(t *testing.T, m *mooncaketest.Master) float64 {
	t.Helper()
	admin, err := mooncake.NewAdminClient(m.AdminURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	mm, err := admin.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	v, ok := mm.Value("master_batch_get_replica_list_requests_total")
	if !ok {
		t.Fatal("the master's metrics have no master_batch_get_replica_list_requests_total")
	}
	return v
}

// newReader starts a Native client without a segment on m, with the given LocateWindow; it is
// closed by t.Cleanup.
func newReader(t *testing.T, m *mooncaketest.Master, window time.Duration) *mooncake.Native {
	t.Helper()
	r, err := mooncake.NewNative(context.Background(), mooncake.NativeOptions{MasterAddr: m.RPCAddr, MetadataURL: m.MetadataURL,
		LocateWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// putPages stores n random pages of size bytes through owner and returns their keys and bytes.
func putPages(t *testing.T, owner *mooncake.Native, prefix string, n, size int) ([]string, [][]byte) {
	t.Helper()
	keys := make([]string, n)
	want := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
		want[i] = make([]byte, size)
		_, _ = rand.Read(want[i])
	}
	for i, c := range owner.BatchPut(context.Background(), keys, want, pool.ReplicateConfig{}) {
		if c != pool.OK {
			t.Fatalf("put %s: %v", keys[i], c)
		}
	}
	return keys, want
}

// getAll gets keys into fresh buffers through r and checks every page against want.
func getAll(t *testing.T, r pool.Pool, keys []string, want [][]byte) {
	t.Helper()
	bufs := make([][]byte, len(keys))
	for i := range bufs {
		bufs[i] = make([]byte, len(want[i]))
	}
	for i, n := range r.BatchGet(context.Background(), keys, bufs) {
		if n != int64(len(want[i])) {
			t.Fatalf("get %s: %d", keys[i], n)
		}
		if !bytes.Equal(bufs[i], want[i]) {
			t.Fatalf("get %s: the bytes differ from those put", keys[i])
		}
	}
}

// TestNativeLocate checks, against the real master, that a lookup's BatchLocate answers as
// BatchIsExist does, that a get of what it found inside its window reads the right bytes
// without asking the master again, that the lease it took keeps the object from a plain
// Remove, and that a get of anything else, or after the window, asks the master as before.
func TestNativeLocate(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	owner := newNative(t, m, 64<<20)
	ctx := context.Background()
	keys, want := putPages(t, owner, "locate", 16, 64<<10)

	reader := newReader(t, m, 30*time.Second)

	probe := append(append([]string{}, keys...), "locate-missing")
	got := reader.BatchLocate(ctx, probe)
	exist := reader.BatchIsExist(ctx, probe)
	for i := range probe {
		wantV := 1
		if i == len(keys) {
			wantV = 0
		}
		if got[i] != wantV || exist[i] != wantV {
			t.Fatalf("%s: BatchLocate %d, BatchIsExist %d, want %d", probe[i], got[i], exist[i], wantV)
		}
	}
	if got := pool.Locate(ctx, reader, probe[len(keys)-1:]); got[0] != 1 || got[1] != 0 {
		t.Fatalf("pool.Locate through Native: %v, want [1 0]", got)
	}

	// The lookup's lease: a plain Remove is refused while it holds.
	if c := owner.Remove(ctx, keys[0], false); c != pool.ErrObjectHasLease {
		t.Fatalf("Remove of a located page: %v, want OBJECT_HAS_LEASE", c)
	}

	before := replicaListCalls(t, m)
	getAll(t, reader, keys, want)
	getAll(t, reader, keys[:4], want[:4]) // the lists serve every get inside the window
	if after := replicaListCalls(t, m); after != before {
		t.Fatalf("gets of located pages asked the master %v times for replica lists, want none", after-before)
	}

	// A page nobody located, and a missing one, are asked for.
	more, moreWant := putPages(t, owner, "locate-more", 2, 4<<10)
	before = replicaListCalls(t, m)
	getAll(t, reader, more, moreWant)
	bufs := [][]byte{make([]byte, 16)}
	if n := reader.BatchGet(ctx, []string{"locate-missing"}, bufs); n[0] != int64(pool.ErrObjectNotFound) {
		t.Fatalf("get of a missing key: %d", n[0])
	}
	if after := replicaListCalls(t, m); after != before+2 {
		t.Fatalf("gets of pages nobody located asked the master %v times, want 2", after-before)
	}

	// A located page whose buffer is too small fails as a fresh list would have it fail.
	reader.BatchLocate(ctx, keys[:1])
	if n := reader.BatchGet(ctx, keys[:1], [][]byte{make([]byte, 16)}); n[0] != int64(pool.ErrInvalidParams) {
		t.Fatalf("get of a located page into a small buffer: %d, want INVALID_PARAMS", n[0])
	}
}

// TestNativeLocateWindow checks that a located list serves gets only inside its window, which
// never reaches past half the master's read lease, and that a negative window turns locating off.
func TestNativeLocateWindow(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{LeaseTTL: 2 * time.Second})
	owner := newNative(t, m, 64<<20)
	ctx := context.Background()
	keys, want := putPages(t, owner, "window", 4, 64<<10)

	for _, c := range []struct {
		name   string
		window time.Duration
		wait   time.Duration
		asks   float64 // replica-list calls of the gets
	}{
		{"inside the window", 30 * time.Second, 0, 0},
		{"past half the lease", 30 * time.Second, 1100 * time.Millisecond, 1},
		{"past the window", 50 * time.Millisecond, 100 * time.Millisecond, 1},
		{"off", -1, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newReader(t, m, c.window)
			for i, v := range r.BatchLocate(ctx, keys) {
				if v != 1 {
					t.Fatalf("BatchLocate %s: %d", keys[i], v)
				}
			}
			time.Sleep(c.wait)
			before := replicaListCalls(t, m)
			getAll(t, r, keys, want)
			asks := replicaListCalls(t, m) - before
			if asks != c.asks {
				t.Fatalf("the gets asked the master for replica lists %v times, want %v", asks, c.asks)
			}
		})
	}
}

var _ pool.Locator = (*mooncake.Native)(nil)

// TestNativeLocateMasterRestart: a master that restarts between a lookup and its load has
// forgotten the lease and the objects, so the load must not read from the lists the lookup
// kept: it asks the new master, which does not have the pages, while the old bytes still lie
// in the holder's segment.
func TestNativeLocateMasterRestart(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	owner := newNative(t, m, 64<<20)
	ctx := context.Background()
	keys, want := putPages(t, owner, "restart", 4, 64<<10)
	reader := newReader(t, m, 30*time.Second)
	getAll(t, reader, keys, want) // the reader knows where the holder's segment is served
	locateAll(t, reader, keys, ones(len(keys)))
	// The holder mounts its segment again on the new master; its memory keeps the old bytes.
	restartMaster(t, m, owner)
	bufs := make([][]byte, len(keys))
	for i := range bufs {
		bufs[i] = make([]byte, len(want[i]))
	}
	for i, n := range reader.BatchGet(ctx, keys, bufs) {
		if n != int64(pool.ErrObjectNotFound) {
			t.Fatalf("get %s after the master restarted: %d, want OBJECT_NOT_FOUND from the new master (a length is a read from the lookup's list)", keys[i], n)
		}
	}
}

// locateAll runs BatchLocate over keys through r and fails unless it answers want, key by key.
func locateAll(t *testing.T, r *mooncake.Native, keys []string, want []int) {
	t.Helper()
	for i, v := range r.BatchLocate(context.Background(), keys) {
		if v != want[i] {
			t.Fatalf("BatchLocate %s: %d, want %d", keys[i], v, want[i])
		}
	}
}

// ones is n 1s.
func ones(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

// TestNativeLocateAnswersFromKept checks, against the real master, that a lookup of keys an
// earlier lookup found answers from the lists it kept during the first half of their window,
// without asking the master; that absent keys, keys nobody located, and every key after that
// half, after a master restart or on a host found unhealthy are asked for; and that a load
// after such a lookup reads the right bytes.
func TestNativeLocateAnswersFromKept(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	owner := newNative(t, m, 64<<20)
	keys, want := putPages(t, owner, "kept", 16, 64<<10)
	reader := newReader(t, m, 30*time.Second)

	asks := func(f func()) float64 {
		t.Helper()
		before := replicaListCalls(t, m)
		f()
		return replicaListCalls(t, m) - before
	}
	if n := asks(func() { locateAll(t, reader, keys, ones(len(keys))) }); n != 1 {
		t.Fatalf("the first lookup asked the master %v times, want 1", n)
	}
	if n := asks(func() {
		locateAll(t, reader, keys, ones(len(keys)))
		locateAll(t, reader, keys[3:9], ones(6))
	}); n != 0 {
		t.Fatalf("lookups of located keys asked the master %v times, want none", n)
	}
	if got := reader.KeptAnswers(); got != 16+6 {
		t.Fatalf("KeptAnswers %d, want %d", got, 16+6)
	}
	// The load after such a lookup reads the right bytes, from the lists as well.
	if n := asks(func() { getAll(t, reader, keys, want) }); n != 0 {
		t.Fatalf("the load after the lookups asked the master %v times, want none", n)
	}

	// A missing key is asked for each time, and a page saved since is found at once; the
	// located keys in the same lookup are not asked for again.
	probe := append(append([]string{}, keys[:4]...), "kept-late")
	if n := asks(func() { locateAll(t, reader, probe, []int{1, 1, 1, 1, 0}) }); n != 1 {
		t.Fatalf("a lookup with a missing key asked the master %v times, want 1", n)
	}
	late, lateWant := putPages(t, owner, "kept-late-page", 1, 4<<10)
	probe[4] = late[0]
	before := reader.KeptAnswers()
	if n := asks(func() { locateAll(t, reader, probe, ones(5)) }); n != 1 {
		t.Fatalf("a lookup with a page saved since asked the master %v times, want 1", n)
	}
	if got := reader.KeptAnswers() - before; got != 4 {
		t.Fatalf("the lookup answered %d keys from kept lists, want 4", got)
	}
	getAll(t, reader, late, lateWant)

	// Past the first half of the window every key is asked for.
	short := newReader(t, m, 2*time.Second)
	locateAll(t, short, keys, ones(len(keys)))
	if n := asks(func() { locateAll(t, short, keys, ones(len(keys))) }); n != 0 {
		t.Fatalf("a lookup inside the first half of a 2 s window asked the master %v times, want none", n)
	}
	time.Sleep(1100 * time.Millisecond)
	if n := asks(func() { locateAll(t, short, keys, ones(len(keys))) }); n != 1 {
		t.Fatalf("a lookup past the first half of the window asked the master %v times, want 1", n)
	}
}

// TestNativeLocateKeptAfterMasterRestart: lists kept before the master restarted answer no
// lookup; the new master, which has forgotten the objects, is asked and answers them absent.
func TestNativeLocateKeptAfterMasterRestart(t *testing.T) {
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	owner := newNative(t, m, 64<<20)
	keys, _ := putPages(t, owner, "kept-restart", 4, 64<<10)
	reader := newReader(t, m, 30*time.Second)
	locateAll(t, reader, keys, ones(len(keys)))
	restartMaster(t, m, owner)
	before := reader.KeptAnswers()
	locateAll(t, reader, keys, make([]int, len(keys)))
	if got := reader.KeptAnswers() - before; got != 0 {
		t.Fatalf("after the master restarted %d keys were answered from lists kept before, want none", got)
	}
}

// restartMaster kills m, starts it again and waits until owner has mounted its segment on it again.
func restartMaster(t *testing.T, m *mooncaketest.Master, owner *mooncake.Native) {
	t.Helper()
	m.Kill()
	m.Restart()
	deadline := time.Now().Add(20 * time.Second)
	for owner.Remounts() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the holder did not mount its segment again on the restarted master")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
