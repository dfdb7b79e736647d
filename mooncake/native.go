package mooncake

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvctl/kvctl/mooncake/masterrpc"
	"github.com/kvctl/kvctl/mooncake/transfer"
	"github.com/kvctl/kvctl/pool"
)

// NativeOptions configure a Native pool client.
type NativeOptions struct {
	// MasterAddr is the master's RPC address, host:port (mooncake_master --rpc_port).
	MasterAddr string
	// MetadataURL is the HTTP metadata server where segments are published and resolved,
	// "http://host:port/metadata" (mooncake_master --enable_http_metadata_server).
	MetadataURL string
	// AdminURL is the master's HTTP admin/metrics address ("http://host:9003"). It is
	// optional: with it Segments lists every segment of the pool and Stats reports the pool's
	// object count and occupancy; without it both cover only this client's own segment.
	AdminURL string
	// SegmentSize is the memory this client contributes to the pool and serves to peers over
	// the Transfer Engine; 0 contributes none (the client only reads and writes others').
	SegmentSize int64
	// Host is the address peers reach this client's segment at; 127.0.0.1 when empty. It
	// also names the segment, "host:port", as Mooncake's TCP clients do.
	Host string
	// DataAddr is where the Transfer Engine server listens; Host with a free port when empty.
	DataAddr string
	// Tenant is the Mooncake tenant of every key; "default" when empty.
	Tenant string
	// CallTimeout bounds each master call and each transfer whose context has no deadline
	// (10 s when zero).
	CallTimeout time.Duration
	// Heartbeat is how often a segment owner pings the master (1 s when zero, as Mooncake's
	// client). The master unmounts a segment whose owner is silent for its --client_ttl.
	Heartbeat time.Duration
	// MasterConns bounds the TCP connections to the master (masterrpc.DefaultConns when zero,
	// at most masterrpc.MaxConns). The master runs the calls of one connection one after
	// another on one of its threads: concurrent calls (the daemon's engines, the heartbeat)
	// spread over the connections, and BatchIsExist splits a large batch over them.
	MasterConns int
	// Transfers bounds the Transfer Engine transfers one batch runs at once (8 when zero).
	Transfers int
	// PeerConns bounds the Transfer Engine connections to one peer's segment, across every
	// batch in flight (32 when zero): at most that many transfers to a peer run at once, and
	// as many connections are kept open for reuse between batches. Several batches run at
	// once (one per engine load), each up to Transfers transfers; were fewer connections kept
	// than run, every batch beyond the first would dial again, a TCP handshake and an accept
	// on the peer per page. The bound also keeps a host from taking more than its share of a
	// peer's connection limit (transfer.DefaultMaxConns).
	PeerConns int
	// HealthMinBackoff and HealthMaxBackoff bound the jittered, doubling wait before an
	// unhealthy peer segment is probed again (DefaultHealthMinBackoff and
	// DefaultHealthMaxBackoff when zero); see SegmentHealth.
	HealthMinBackoff, HealthMaxBackoff time.Duration
	// Logger receives heartbeat and remount events; nil discards them.
	Logger *slog.Logger
	// ObjectChecksum fills Mooncake's own per-object checksum (ObjectChecksum, CRC-64/ECMA-182)
	// at every put and, at every get of an object that has one, verifies the bytes read
	// against the checksum the master keeps: a page rewritten in a segment, or read from a
	// forged one, is refused (ErrMooncakeChecksum, counted in Stats.ChecksumErrors) and
	// removed from the pool, never returned. Mooncake's own client does the same with
	// MOONCAKE_STORE_CHECKSUM=1; objects written without a checksum are read unchecked.
	ObjectChecksum bool
	// LocateWindow is how long the replica list a lookup fetched (BatchLocate) serves a get
	// of the same object without asking the master again, at most half the master's read
	// lease (DefaultLocateWindow when zero). Negative turns it off: BatchLocate is then
	// BatchIsExist, and every get asks the master.
	LocateWindow time.Duration
}

// Native is a Mooncake store client in Go: it speaks the master's RPC protocol for
// metadata and the Transfer Engine's TCP protocol for bytes, mounts an optional segment of its
// own and serves it to peers (other kvctl processes or Mooncake's own clients). It implements
// Pool; pages are stored exactly as given, with no envelope, so Mooncake's own client reads
// what Native writes and the other way round.
//
// A put is BatchPutStart (the master allocates replicas), Transfer Engine WRITEs into them,
// then BatchPutEnd; a failed write is revoked, so a reader never sees a half-written page.
// Native is safe for concurrent use.
type Native struct {
	opts   NativeOptions
	rpc    *masterrpc.Client
	meta   *transfer.MetadataClient
	te     *transfer.Client
	srv    *transfer.Server
	admin  atomic.Pointer[AdminClient] // nil without AdminURL, or once dropped (DropAdmin)
	log    *slog.Logger
	client masterrpc.UUID

	seg     masterrpc.Segment
	desc    transfer.SegmentDesc
	mounted bool

	epMu      sync.Mutex
	endpoints map[string]peerSegment // segment name → its data address and buffers

	slotMu sync.Mutex
	slots  map[string]chan struct{} // TE data address → its PeerConns transfer slots

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	remounts atomic.Int64
	stats    nativeStats
	health   *segmentHealth
	// existSplit is the package's existSplit; tests lower it to split small batches.
	existSplit int
	// coalesce is the most bytes one transfer of a get or put moves (maxCoalesced); a benchmark
	// sets it to 0 to move one page a transfer in the same run.
	coalesce int
	// located keeps the replica lists lookups found (BatchLocate) for the gets that follow.
	located locatedSet
}

type nativeStats struct {
	hits, misses, puts, skipped, putFailures atomic.Int64
	bytesIn, bytesOut, existProbes           atomic.Int64
	checksumErrors                           atomic.Int64
	// keptAnswers counts the keys lookups answered from kept replica lists (BatchLocate).
	keptAnswers atomic.Int64
}

// segmentBase is where Native places its segment in the absolute address space peers use.
// Peers only ever see addresses the master hands out inside [base, base+size); a per-process
// random base keeps an address meant for one segment from being valid in another.
func segmentBase() uint64 {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return 0x1000_0000_0000 + uint64(binary.LittleEndian.Uint16(b[:])&0x0fff)<<32
}

func newUUID() masterrpc.UUID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return masterrpc.UUID{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}
}

// NewNative connects to the master, checks its protocol version, and when SegmentSize > 0
// starts the Transfer Engine server, publishes the segment on the metadata server and mounts
// it. An unreachable master is an error wrapping masterrpc.ErrUnavailable; a master of
// another version one wrapping masterrpc.ErrProtocol.
func NewNative(ctx context.Context, opts NativeOptions) (*Native, error) {
	if opts.MasterAddr == "" {
		return nil, errors.New("mooncake native: no master RPC address")
	}
	if opts.MetadataURL == "" {
		return nil, errors.New("mooncake native: no metadata server URL")
	}
	if opts.SegmentSize < 0 {
		return nil, fmt.Errorf("mooncake native: segment size %d is negative", opts.SegmentSize)
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Tenant == "" {
		opts.Tenant = masterrpc.DefaultTenant
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 10 * time.Second
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = time.Second
	}
	if opts.Transfers <= 0 {
		opts.Transfers = 8
	}
	if opts.PeerConns <= 0 {
		opts.PeerConns = 32
	}
	if opts.LocateWindow == 0 {
		opts.LocateWindow = DefaultLocateWindow
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	meta, err := transfer.NewMetadataClient(opts.MetadataURL, transfer.MetadataOptions{Timeout: opts.CallTimeout})
	if err != nil {
		return nil, err
	}
	n := &Native{
		opts:       opts,
		meta:       meta,
		te:         transfer.NewClient(transfer.ClientOptions{Timeout: opts.CallTimeout, MaxIdlePerPeer: opts.PeerConns}),
		log:        log,
		client:     newUUID(),
		endpoints:  map[string]peerSegment{},
		slots:      map[string]chan struct{}{},
		stop:       make(chan struct{}),
		health:     newSegmentHealth(opts.HealthMinBackoff, opts.HealthMaxBackoff),
		existSplit: existSplit,
		coalesce:   maxCoalesced,
	}
	if opts.AdminURL != "" {
		a, aerr := NewAdminClient(opts.AdminURL, nil)
		if aerr != nil {
			return nil, aerr
		}
		n.admin.Store(a)
	}
	n.rpc, err = masterrpc.Dial(ctx, masterrpc.Options{Addr: opts.MasterAddr, CallTimeout: opts.CallTimeout, Conns: opts.MasterConns})
	if err != nil {
		return nil, fmt.Errorf("mooncake native: %w", err)
	}
	if _, err := n.rpc.GetStorageConfig(ctx); err != nil {
		_ = n.rpc.Close()
		return nil, fmt.Errorf("mooncake native: %w", err)
	}
	if opts.SegmentSize > 0 {
		if err := n.mount(ctx); err != nil {
			n.shutdown(ctx)
			return nil, err
		}
		n.wg.Add(1)
		go n.heartbeat()
	}
	n.wg.Add(1)
	go n.prober()
	return n, nil
}

// ErrTransferListen is what mounting fails with when the segment's transfer server cannot
// listen on its address (its port taken, its host address not this machine's): the master may
// well be up. Test with errors.Is.
var ErrTransferListen = errors.New("cannot serve the segment to peers")

func (n *Native) mount(ctx context.Context) error {
	addr := n.opts.DataAddr
	if addr == "" {
		addr = net.JoinHostPort(n.opts.Host, "0")
	}
	srv, err := transfer.NewServer(transfer.ServerOptions{Addr: addr, Logger: n.opts.Logger})
	if err != nil {
		return fmt.Errorf("mooncake native: %w: %w", ErrTransferListen, err)
	}
	n.srv = srv
	go func() { _ = srv.Serve() }()
	mem := make([]byte, n.opts.SegmentSize)
	base := segmentBase()
	if err := srv.Register(base, mem); err != nil {
		return fmt.Errorf("mooncake native: %w", err)
	}
	port := srv.Port()
	name := net.JoinHostPort(n.opts.Host, strconv.Itoa(port))
	n.desc = transfer.SegmentDesc{
		Name:            name,
		Protocol:        transfer.ProtocolTCP,
		Buffers:         []transfer.BufferDesc{{Name: "cpu:0", Addr: base, Length: uint64(len(mem))}},
		TCPDataPort:     port,
		TCPProtoVersion: 2,
		Timestamp:       time.Now().Format("2006-01-02 15:04:05.000000"),
	}
	if err := n.meta.PublishSegment(ctx, n.desc, n.opts.Host, port); err != nil {
		return fmt.Errorf("mooncake native: publishing segment %s: %w", name, err)
	}
	n.seg = masterrpc.Segment{ID: newUUID(), Name: name, Base: base, Size: uint64(len(mem)), TEEndpoint: name, Protocol: transfer.ProtocolTCP}
	if err := n.rpc.MountSegment(ctx, n.seg, n.client); err != nil {
		_ = n.meta.RemoveSegment(ctx, name)
		return fmt.Errorf("mooncake native: mounting segment %s: %w", name, err)
	}
	n.mounted = true
	return nil
}

// heartbeat pings the master and remounts the segment when the master has lost it (after
// a restart, or after it timed the client out).
func (n *Native) heartbeat() {
	defer n.wg.Done()
	t := time.NewTicker(n.opts.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.opts.CallTimeout)
		p, err := n.rpc.Ping(ctx, n.client)
		if err == nil && p.ClientStatus != masterrpc.ClientOK {
			// A master that lost the segment may also have lost its metadata (the metadata
			// server runs inside mooncake_master): publish it again before mounting, so peers
			// that did not cache the old answer can resolve the segment.
			err = n.meta.PublishSegment(ctx, n.desc, n.opts.Host, n.desc.TCPDataPort)
			if err == nil {
				err = n.rpc.ReMountSegment(ctx, []masterrpc.Segment{n.seg}, n.client)
			}
			if err == nil {
				n.remounts.Add(1)
				n.log.Info("mooncake segment remounted", "segment", n.seg.Name, "master", n.opts.MasterAddr)
			}
		}
		cancel()
		if err != nil {
			n.log.Warn("mooncake heartbeat failed", "master", n.opts.MasterAddr, "err", err)
		}
	}
}

// SegmentName returns the name of this client's mounted segment ("" when it has none).
func (n *Native) SegmentName() string { return n.seg.Name }

// SegmentID is the id this client mounted its segment under, random for each client: an admin
// server that lists it serves the master this client mounted with.
func (n *Native) SegmentID() masterrpc.UUID { return n.seg.ID }

// DropAdmin stops asking the master's admin server (one found to serve another master):
// Segments is then this client's own segment and Stats has no cluster-wide figures.
func (n *Native) DropAdmin() { n.admin.Store(nil) }

// Remounts counts the times the segment was mounted again after the master lost it.
func (n *Native) Remounts() int64 { return n.remounts.Load() }

// KeptAnswers is how many keys lookups (BatchLocate) answered from replica lists an earlier
// lookup kept, without asking the master.
func (n *Native) KeptAnswers() int64 { return n.stats.keptAnswers.Load() }

// Close unmounts the segment (the master drops the objects stored in it), removes its
// metadata and stops serving it. It is safe to call more than once.
func (n *Native) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), n.opts.CallTimeout)
	defer cancel()
	n.shutdown(ctx)
	return nil
}

func (n *Native) shutdown(ctx context.Context) {
	n.once.Do(func() {
		close(n.stop)
		n.wg.Wait()
		if n.mounted {
			if err := n.rpc.UnmountSegment(ctx, n.seg.ID, n.client); err != nil {
				n.log.Warn("mooncake unmount failed", "segment", n.seg.Name, "err", err)
			}
		}
		if n.seg.Name != "" {
			_ = n.meta.RemoveSegment(ctx, n.seg.Name)
		}
		if n.srv != nil {
			_ = n.srv.Close()
		}
		_ = n.te.Close()
		_ = n.rpc.Close()
	})
}

func (n *Native) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, n.opts.CallTimeout)
}

// rpcCode maps a failed master call to the Code every key of the batch gets.
func rpcCode(err error) Code {
	var ce *masterrpc.CodeError
	if errors.As(err, &ce) {
		return Code(ce.Code)
	}
	return ErrRPCFail
}

// existSplit is the fewest keys a sub-batch of BatchIsExist carries. The master answers one
// BatchExistKey on one of its threads, key after key (about half a microsecond a key); a batch
// of at least twice this many is split into sub-batches, at most one per master connection,
// sent at once, so that several of the master's threads answer it. A smaller sub-batch does not
// pay for its own round trip and wake-ups: on a two-core host shared with a busy process, 3,000
// keys as two or four sub-batches were no faster than as one call, and often slower
// (docs/perf/mooncake.md).
const existSplit = 4096

// BatchIsExist asks the master which keys hold a complete object. A large batch goes as
// sub-batches over several master connections at once (inParts).
func (n *Native) BatchIsExist(ctx context.Context, keys []string) []int {
	if len(keys) == 0 {
		return []int{}
	}
	n.stats.existProbes.Add(int64(len(keys)))
	ctx, cancel := n.callCtx(ctx)
	defer cancel()
	out := n.inParts(ctx, keys, n.exist)
	if n.health.any() {
		n.hideUnhealthy(ctx, keys, out)
	}
	return out
}

// exist is one BatchExistKey call: the master's answer for each key, or for each the code of
// the call's failure.
func (n *Native) exist(ctx context.Context, keys []string) []int {
	res, err := n.rpc.BatchExistKey(ctx, keys, n.opts.Tenant)
	if err == nil {
		return res
	}
	n.log.Warn("mooncake BatchExistKey failed", "keys", len(keys), "err", err)
	out := make([]int, len(keys))
	for i := range out {
		out[i] = int(rpcCode(err))
	}
	return out
}

// hideUnhealthy turns the present keys whose replica lives in an unhealthy peer segment into
// misses, so no request is offered pages that its load would fail to read. It costs one
// BatchGetReplicaList, only while some segment is unhealthy; when that call fails the answer
// stands (the load then fails fast on the unhealthy segment).
func (n *Native) hideUnhealthy(ctx context.Context, keys []string, out []int) {
	var present []string
	var idx []int
	for i, v := range out {
		if v == 1 {
			present, idx = append(present, keys[i]), append(idx, i)
		}
	}
	if len(present) == 0 {
		return
	}
	lists, err := n.rpc.BatchGetReplicaList(ctx, present, n.opts.Tenant)
	if err != nil || len(lists) != len(present) {
		return
	}
	for j, l := range lists {
		if l.Code != 0 {
			continue
		}
		if rep, ok := readable(l.List.Replicas); ok && n.peerUnhealthy(rep.Endpoint) {
			out[idx[j]] = 0
		}
	}
}

// peerUnhealthy reports whether seg is another host's segment marked unhealthy.
func (n *Native) peerUnhealthy(seg string) bool {
	return (n.srv == nil || seg != n.seg.Name) && n.health.unhealthy(seg)
}

// config maps kvctl's per-put options onto Mooncake's ReplicateConfig for the given keys'
// group ids.
func (n *Native) config(cfg pool.ReplicateConfig, groups []string) masterrpc.ReplicateConfig {
	rc := masterrpc.ReplicateConfig{ReplicaNum: 1, SoftPinAction: uint8(cfg.SoftPinAction), WithHardPin: cfg.HardPin}
	if cfg.SoftPinTTL > 0 {
		rc.HasSoftPinTTL = true
		rc.SoftPinTTLms = uint64(max(cfg.SoftPinTTL.Milliseconds(), 1))
	}
	if groups != nil {
		rc.HasGroupIDs = true
		rc.GroupIDs = groups
	}
	return rc
}

// BatchPut stores each buffer under its key: the master allocates the replicas, the bytes go
// to them over the Transfer Engine (or straight into this client's segment when the master
// placed them there), and only then does the put end. A key that already exists is OK
// without a write, as Mooncake's client treats OBJECT_ALREADY_EXISTS.
func (n *Native) BatchPut(ctx context.Context, keys []string, bufs [][]byte, cfg pool.ReplicateConfig) []Code {
	if len(bufs) != len(keys) {
		return n.put(ctx, keys, nil, cfg)
	}
	return n.put(ctx, keys, onePiece(bufs), cfg)
}

var _ pool.PieceCopier = (*Native)(nil)

// BatchPutPieces implements pool.PieceCopier: BatchPut of values each given as pieces, in
// order. Each replica is written in one Transfer Engine request sent from the pieces where they
// lie (writev), or copied piece by piece into this client's own segment.
func (n *Native) BatchPutPieces(ctx context.Context, keys []string, srcs [][][]byte, cfg pool.ReplicateConfig) []Code {
	return n.put(ctx, keys, srcs, cfg)
}

// put is BatchPut of values given as pieces (bufs[i] the pieces of keys[i]).
func (n *Native) put(ctx context.Context, keys []string, bufs [][][]byte, cfg pool.ReplicateConfig) []Code {
	out := make([]Code, len(keys))
	fail := func(c Code) []Code {
		for i := range out {
			out[i] = c
		}
		return out
	}
	if len(bufs) != len(keys) || (cfg.GroupIDs != nil && len(cfg.GroupIDs) != len(keys)) ||
		(cfg.SoftPinTTL != 0 && cfg.SoftPinAction != pool.SoftPinEnable) || cfg.SoftPinTTL < 0 || cfg.SoftPinAction > pool.SoftPinDisable {
		n.stats.putFailures.Add(int64(len(keys)))
		return fail(ErrInvalidParams)
	}
	// One master call per distinct key: a later duplicate in the batch shares the first's
	// result, as it would have found the key existing.
	first := make(map[string]int, len(keys))
	var idx []int
	for i, k := range keys {
		switch {
		case k == "" || piecesLen(bufs[i]) == 0:
			out[i] = ErrInvalidParams
			n.stats.putFailures.Add(1)
			continue
		}
		if _, dup := first[k]; dup {
			continue
		}
		first[k] = i
		idx = append(idx, i)
	}
	if len(idx) > 0 {
		n.putUnique(ctx, keys, bufs, cfg, idx, out)
	}
	for i, k := range keys {
		if j, ok := first[k]; ok && j != i {
			out[i] = out[j]
			if out[j] == OK {
				n.stats.skipped.Add(1)
			}
		}
	}
	return out
}

func (n *Native) putUnique(ctx context.Context, keys []string, bufs [][][]byte, cfg pool.ReplicateConfig, idx []int, out []Code) {
	ctx, cancel := n.callCtx(ctx)
	defer cancel()
	ks := make([]string, len(idx))
	sizes := make([]uint64, len(idx))
	var groups []string
	if cfg.GroupIDs != nil {
		groups = make([]string, len(idx))
	}
	for j, i := range idx {
		ks[j] = keys[i]
		sizes[j] = piecesLen(bufs[i])
		if groups != nil {
			groups[j] = cfg.GroupIDs[i]
		}
	}
	started, err := n.rpc.BatchPutStart(ctx, n.client, ks, sizes, n.config(cfg, groups), n.opts.Tenant)
	if err != nil {
		n.log.Warn("mooncake BatchPutStart failed", "err", err)
		for _, i := range idx {
			out[i] = rpcCode(err)
		}
		n.stats.putFailures.Add(int64(len(idx)))
		return
	}
	writeErr := make([]error, len(idx))
	var sums []uint64
	if n.opts.ObjectChecksum {
		sums = make([]uint64, len(idx))
	}
	// Each replica of each page to write; replicas lying back to back in one buffer of a
	// segment are written in one transfer (coalesce), sent from each page's pieces in turn.
	type putJob struct {
		j     int // index into idx
		rep   masterrpc.Replica
		first bool // the page's first replica: its run takes the page's checksum
	}
	var jobs []putJob
	for j, i := range idx {
		r := started[j]
		switch {
		case r.Code == int32(ErrObjectAlreadyExists):
			out[i] = OK
			n.stats.skipped.Add(1)
			continue
		case r.Code != 0:
			out[i] = Code(r.Code)
			n.stats.putFailures.Add(1)
			continue
		case len(r.Replicas) == 0:
			writeErr[j] = errors.New("master allocated no replica")
			continue
		}
		for k, rep := range r.Replicas {
			if size := piecesLen(bufs[i]); rep.Size != size {
				writeErr[j] = fmt.Errorf("replica %d holds %d bytes, the page has %d", rep.ID, rep.Size, size)
				break
			}
			jobs = append(jobs, putJob{j: j, rep: rep, first: k == 0})
		}
	}
	if len(jobs) > 0 && slices.ContainsFunc(writeErr, func(err error) bool { return err != nil }) {
		// A page with a replica of the wrong size is revoked whole: none of its replicas is
		// written.
		jobs = slices.DeleteFunc(jobs, func(p putJob) bool { return writeErr[p.j] != nil })
	}
	runs := groupRuns(ctx, n, jobs, func(p *putJob) *masterrpc.Replica { return &p.rep })
	runErr := make([]error, len(runs))
	n.runTransfers(len(runs), func(k int) {
		rep := runs[k][0].rep
		var all [][]byte
		for _, p := range runs[k] {
			buf := bufs[idx[p.j]]
			if p.first && sums != nil {
				sums[p.j] = piecesChecksum(buf)
			}
			all = append(all, buf...)
		}
		rep.Size = piecesLen(all)
		runErr[k] = n.transfer(ctx, rep, all, true)
	})
	// A failed transfer fails every page it carried (any of a page's replicas failing revokes
	// the page).
	for k, err := range runErr {
		if err != nil {
			for _, p := range runs[k] {
				writeErr[p.j] = err
			}
		}
	}
	var endKeys, revokeKeys []string
	var endIdx, revokeIdx []int
	var endMeta []masterrpc.ObjectMeta
	for j, i := range idx {
		if started[j].Code != 0 {
			continue
		}
		if writeErr[j] != nil {
			n.log.Warn("mooncake put transfer failed; revoking", "key", ks[j], "err", writeErr[j])
			revokeKeys, revokeIdx = append(revokeKeys, ks[j]), append(revokeIdx, i)
			continue
		}
		endKeys, endIdx = append(endKeys, ks[j]), append(endIdx, i)
		if sums != nil {
			endMeta = append(endMeta, masterrpc.ObjectMeta{Key: ks[j], HasChecksum: true, Checksum: sums[j]})
		}
	}
	if len(revokeKeys) > 0 {
		if _, rerr := n.rpc.BatchPutRevoke(ctx, n.client, revokeKeys, n.opts.Tenant); rerr != nil {
			// The master discards unfinished puts by itself (put_start_discard_timeout_sec);
			// the keys never became readable.
			n.log.Warn("mooncake BatchPutRevoke failed", "err", rerr)
		}
		for _, i := range revokeIdx {
			out[i] = ErrRPCFail
		}
		n.stats.putFailures.Add(int64(len(revokeIdx)))
	}
	if len(endKeys) == 0 {
		return
	}
	var ends []int32
	if endMeta != nil {
		ends, err = n.rpc.BatchPutEndMeta(ctx, n.client, endMeta, n.opts.Tenant)
	} else {
		ends, err = n.rpc.BatchPutEnd(ctx, n.client, endKeys, n.opts.Tenant)
	}
	for j, i := range endIdx {
		switch {
		case err != nil:
			out[i] = rpcCode(err)
		case ends[j] != 0:
			out[i] = Code(ends[j])
		default:
			out[i] = OK
			n.stats.puts.Add(1)
			n.stats.bytesIn.Add(int64(piecesLen(bufs[i])))
			continue
		}
		n.stats.putFailures.Add(1)
	}
}

// getJob is one page a BatchGet reads: its index in the batch and the replica it reads.
type getJob struct {
	i    int
	rep  masterrpc.Replica
	list masterrpc.ReplicaList
	// expires is the read lease's end for a replica read from a list a lookup kept; zero
	// for one the get asked the master for (the read runs inside that list's fresh lease).
	expires time.Time
}

// maxCoalesced bounds one transfer that reads or writes several pages lying back to back
// in one segment (coalesce). The peer stages a READ whole before it sends it, so a larger one
// holds more of its staging. On the dev VM (BenchmarkNativeGetTransfers, docs/perf/cluster.md)
// 64 KiB pages read in 256 KiB transfers came 31–46 % faster for one loader and 65–79 % for
// four, where 1 MiB transfers gained less and slowed 256 KiB pages read four at a time.
const maxCoalesced = 256 << 10

// coalesce groups jobs (the pages of a get or the replicas of a put) into runs, each moved in
// one transfer: replicas in one segment that lie back to back (one ending where the next
// starts), in address order, up to limit bytes a run (a replica that alone reaches it is a run
// of its own), and only where join says the run's first replica and the next lie in one
// registered buffer. A transfer costs a round trip with the peer whatever its size, so small
// pages the peer's allocator laid out in a row take a few transfers instead of one a page. The
// jobs are reordered in place; rep gives a job's replica.
func coalesce[J any](jobs []J, rep func(*J) *masterrpc.Replica, limit int, join func(a, b *masterrpc.Replica) bool) [][]J {
	if len(jobs) < 2 {
		if len(jobs) == 0 {
			return nil
		}
		return [][]J{jobs}
	}
	slices.SortFunc(jobs, func(a, b J) int {
		ra, rb := rep(&a), rep(&b)
		if c := strings.Compare(ra.Endpoint, rb.Endpoint); c != 0 {
			return c
		}
		return cmp.Compare(ra.Addr, rb.Addr)
	})
	var runs [][]J
	start, size := 0, rep(&jobs[0]).Size
	for k := 1; k < len(jobs); k++ {
		prev, cur := rep(&jobs[k-1]), rep(&jobs[k])
		if cur.Endpoint == prev.Endpoint && cur.Kind == prev.Kind && cur.Protocol == prev.Protocol &&
			prev.Addr+prev.Size == cur.Addr && prev.Addr+prev.Size > prev.Addr && size+cur.Size <= uint64(limit) &&
			join(rep(&jobs[start]), cur) {
			size += cur.Size
			continue
		}
		runs = append(runs, jobs[start:k])
		start, size = k, cur.Size
	}
	return append(runs, jobs[start:])
}

// runTransfers runs do(0) .. do(count-1), at most Transfers at once, and returns once all are
// done. The last one runs in the caller's goroutine: a batch of one page (the common small get
// or put) then starts no goroutine and waits on nothing, which on a busy machine saves a wake-up
// of the caller that waits its turn for a core.
func (n *Native) runTransfers(count int, do func(k int)) {
	if count == 0 {
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, n.opts.Transfers)
	for k := range count - 1 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			do(k)
		}()
	}
	sem <- struct{}{}
	do(count - 1)
	<-sem
	wg.Wait()
}

// transfer moves a value, the pieces buf in order, to (write) or from (read) one memory
// replica: one Transfer Engine request, or copies piece by piece in this client's own segment.
func (n *Native) transfer(ctx context.Context, rep masterrpc.Replica, buf [][]byte, write bool) error {
	if rep.Kind != masterrpc.ReplicaMemory {
		return fmt.Errorf("replica %d is not in memory (kind %d); kvctl reads and writes memory replicas only", rep.ID, rep.Kind)
	}
	if rep.Protocol != transfer.ProtocolTCP {
		return fmt.Errorf("replica %d in segment %q uses protocol %q; kvctl speaks only tcp", rep.ID, rep.Endpoint, rep.Protocol)
	}
	if size := piecesLen(buf); rep.Size != size {
		return fmt.Errorf("replica %d holds %d bytes, the page has %d", rep.ID, rep.Size, size)
	}
	if n.srv != nil && rep.Endpoint == n.seg.Name {
		addr := rep.Addr
		for _, p := range buf {
			var err error
			if write {
				err = n.srv.WriteAt(addr, p)
			} else {
				err = n.srv.ReadAt(addr, p)
			}
			if err != nil {
				return err
			}
			addr += uint64(len(p))
		}
		return nil
	}
	peer, err := n.resolve(ctx, rep.Endpoint)
	if err != nil {
		n.health.fail(rep.Endpoint)
		return err
	}
	slot := n.peerSlots(peer)
	select {
	case slot <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for a transfer slot to %s: %w", peer, ctx.Err())
	}
	if write {
		err = n.te.WritePieces(ctx, peer, rep.Addr, buf)
	} else {
		err = n.te.ReadPieces(ctx, peer, rep.Addr, buf)
	}
	<-slot
	if err != nil {
		// The peer may have restarted on another port: look it up again next time.
		n.epMu.Lock()
		delete(n.endpoints, rep.Endpoint)
		n.epMu.Unlock()
		if !errors.Is(ctx.Err(), context.Canceled) {
			// A transfer the caller gave up on says nothing about the peer; one that ran out
			// of time does (a host that does not answer).
			n.health.fail(rep.Endpoint)
		}
		return err
	}
	n.health.ok(rep.Endpoint)
	return nil
}

// peerSlots returns the semaphore that bounds the transfers to one peer's data address.
func (n *Native) peerSlots(peer string) chan struct{} {
	n.slotMu.Lock()
	defer n.slotMu.Unlock()
	s, ok := n.slots[peer]
	if !ok {
		if len(n.slots) > 4096 {
			// Addresses of peers long gone: a fresh map only lets transfers to a peer whose
			// semaphore was dropped run beside the ones still holding the old one, once.
			clear(n.slots)
		}
		s = make(chan struct{}, n.opts.PeerConns)
		n.slots[peer] = s
	}
	return s
}

func (n *Native) resolve(ctx context.Context, segment string) (string, error) {
	n.epMu.Lock()
	p, ok := n.endpoints[segment]
	n.epMu.Unlock()
	if ok {
		return p.addr, nil
	}
	ep, err := n.meta.Resolve(ctx, segment)
	if err != nil {
		return "", fmt.Errorf("segment %q: %w", segment, err)
	}
	if ep.ProtoVersion < 2 {
		return "", fmt.Errorf("segment %q speaks Transfer Engine TCP framing v%d; kvctl needs v2", segment, ep.ProtoVersion)
	}
	n.epMu.Lock()
	if len(n.endpoints) > 4096 {
		clear(n.endpoints)
	}
	n.endpoints[segment] = peerSegment{addr: ep.Addr, desc: ep.Segment}
	n.epMu.Unlock()
	return ep.Addr, nil
}

// peerSegment is what this client keeps of a peer's published segment descriptor: the data
// address transfers go to, and the buffers the peer registered, which bound a coalesced transfer.
type peerSegment struct {
	addr string
	desc transfer.SegmentDesc
}

// oneBuffer reports whether [a.Addr, b.Addr+b.Size) lies inside one buffer of the segment a
// and b live in. This client's own segment is one region. A peer's buffers are those its
// descriptor lists; a peer whose descriptor this client has not resolved (resolving failed) is
// taken as not. A transfer across two buffers is refused by kvctl's server and need not be
// valid memory on another, so a run of pages never spans two.
func (n *Native) oneBuffer(a, b *masterrpc.Replica) bool {
	if b.Addr+b.Size < a.Addr {
		return false
	}
	if n.srv != nil && a.Endpoint == n.seg.Name {
		return true
	}
	n.epMu.Lock()
	p, ok := n.endpoints[a.Endpoint]
	n.epMu.Unlock()
	return ok && p.desc.Contains(a.Addr, b.Addr+b.Size-a.Addr)
}

// groupRuns groups a batch's jobs into runs of n's transfers (coalesce). First it resolves the
// peers the batch moves more than one page to or from that n has not resolved yet, so that
// oneBuffer knows their buffers on a first batch too (the transfers would resolve them right
// after); a peer that fails to resolve is left to the transfers, which fail and mark it
// unhealthy as before.
func groupRuns[J any](ctx context.Context, n *Native, jobs []J, rep func(*J) *masterrpc.Replica) [][]J {
	if n.coalesce > 0 && len(jobs) > 1 {
		pages := map[string]int{}
		for k := range jobs {
			if r := rep(&jobs[k]); n.srv == nil || r.Endpoint != n.seg.Name {
				pages[r.Endpoint]++
			}
		}
		for seg, count := range pages {
			n.epMu.Lock()
			_, ok := n.endpoints[seg]
			n.epMu.Unlock()
			if count > 1 && !ok {
				_, _ = n.resolve(ctx, seg)
			}
		}
	}
	return coalesce(jobs, rep, n.coalesce, n.oneBuffer)
}

// BatchGet copies each object into bufs[i] over the Transfer Engine (or from this client's
// own segment) and returns its length or a negative Code.
func (n *Native) BatchGet(ctx context.Context, keys []string, bufs [][]byte) []int64 {
	if len(bufs) != len(keys) {
		return n.get(ctx, keys, nil)
	}
	return n.get(ctx, keys, onePiece(bufs))
}

// BatchGetPieces implements pool.PieceCopier: BatchGet into destinations given as pieces, filled
// in order. Each value is read in one Transfer Engine request whose payload lands straight in
// its pieces (readv), or copied piece by piece from this client's own segment; a value is
// checked (the object checksum, when on) and handed back cleared on failure as BatchGet's.
func (n *Native) BatchGetPieces(ctx context.Context, keys []string, dsts [][][]byte) []int64 {
	return n.get(ctx, keys, dsts)
}

// get is BatchGet into values given as pieces (bufs[i] the pieces of keys[i]'s destination).
func (n *Native) get(ctx context.Context, keys []string, bufs [][][]byte) []int64 {
	out := make([]int64, len(keys))
	if len(keys) == 0 {
		return out
	}
	if len(bufs) != len(keys) {
		for i := range out {
			out[i] = int64(ErrInvalidParams)
		}
		return out
	}
	ctx, cancel := n.callCtx(ctx)
	defer cancel()
	jobs := make([]getJob, 0, len(keys))
	// The objects a lookup located moments ago are read from the lists it kept; the master is
	// asked for the rest.
	ask, askKeys := n.takeLocated(keys, bufs, out, &jobs)
	if len(ask) > 0 {
		lists, err := n.rpc.BatchGetReplicaList(ctx, askKeys, n.opts.Tenant)
		if err == nil && len(lists) != len(askKeys) {
			err = errWrongCount
		}
		if err != nil {
			n.log.Warn("mooncake BatchGetReplicaList failed", "err", err)
			for _, i := range ask {
				out[i] = int64(rpcCode(err))
			}
			ask = nil
		}
		for j, i := range ask {
			l := lists[j]
			if l.Code != 0 {
				out[i] = int64(l.Code)
				if l.Code == int32(ErrObjectNotFound) {
					n.stats.misses.Add(1)
				}
				continue
			}
			rep, ok := readable(l.List.Replicas)
			if code := n.gettable(rep, ok, bufs[i]); code != 0 {
				out[i] = int64(code)
				continue
			}
			jobs = append(jobs, getJob{i: i, rep: rep, list: l.List})
		}
	}
	poisoned := make([]bool, len(keys))
	// done finishes page j once its bytes are in dst: the lease and the checksum.
	done := func(j getJob, dst [][]byte) {
		i, rep := j.i, j.rep
		if !j.expires.IsZero() && !time.Now().Before(j.expires) {
			// Read from a list a lookup kept, and the read lease ended before the read did:
			// the object may have been evicted and its memory reused meanwhile.
			clearPieces(dst)
			out[i] = int64(ErrLeaseExpired)
			return
		}
		if !n.checksumOK(keys[i], rep, j.list, dst) {
			clearPieces(dst) // the caller's buffer never keeps a poisoned page
			out[i] = int64(ErrMooncakeChecksum)
			poisoned[i] = true
			return
		}
		out[i] = int64(rep.Size)
		n.stats.hits.Add(1)
		n.stats.bytesOut.Add(int64(rep.Size))
	}
	// Pages that lie back to back in one buffer of a segment are read in one transfer
	// (coalesce), its payload landing in each page's destination in turn.
	runs := groupRuns(ctx, n, jobs, func(j *getJob) *masterrpc.Replica { return &j.rep })
	read := func(run []getJob) {
		rep := run[0].rep
		dsts := make([][][]byte, len(run))
		var all [][]byte
		for k, j := range run {
			dsts[k] = piecesUpTo(bufs[j.i], j.rep.Size)
			all = append(all, dsts[k]...)
		}
		rep.Size = piecesLen(all)
		if err := n.transfer(ctx, rep, all, false); err != nil {
			n.log.Warn("mooncake get transfer failed", "key", keys[run[0].i], "pages", len(run), "segment", rep.Endpoint, "err", err)
			for _, j := range run {
				out[j.i] = int64(ErrRPCFail)
			}
			return
		}
		for k, j := range run {
			done(j, dsts[k])
		}
	}
	n.runTransfers(len(runs), func(k int) { read(runs[k]) })
	for i, bad := range poisoned {
		if bad {
			n.removePoisoned(ctx, keys[i])
		}
	}
	return out
}

// checksumOK verifies the bytes read for key against the checksum the master keeps for it,
// when checksums are on and the object has one. A mismatch is counted and logged.
func (n *Native) checksumOK(key string, rep masterrpc.Replica, l masterrpc.ReplicaList, got [][]byte) bool {
	if !n.opts.ObjectChecksum || !l.HasChecksum {
		return true
	}
	sum := piecesChecksum(got)
	if sum == l.Checksum {
		return true
	}
	n.stats.checksumErrors.Add(1)
	n.log.Warn("mooncake object checksum mismatch: the page was changed in its segment after it was put; refusing it",
		"key", key, "segment", rep.Endpoint, "addr", rep.Addr, "want", l.Checksum, "got", sum)
	return false
}

// removePoisoned removes an object whose bytes no longer match its checksum, so that the next
// save stores it again instead of finding it present.
func (n *Native) removePoisoned(ctx context.Context, key string) {
	if code, err := n.rpc.Remove(ctx, key, true, n.opts.Tenant); err != nil || (code != 0 && code != int32(ErrObjectNotFound)) {
		n.log.Warn("mooncake: removing an object whose checksum does not match failed", "key", key, "code", code, "err", err)
	}
}

// readable picks the first complete memory replica.
func readable(reps []masterrpc.Replica) (masterrpc.Replica, bool) {
	for _, r := range reps {
		if r.Kind == masterrpc.ReplicaMemory && r.Status == masterrpc.ReplicaComplete {
			return r, true
		}
	}
	return masterrpc.Replica{}, false
}

// Remove deletes one object through the master.
func (n *Native) Remove(ctx context.Context, key string, force bool) Code {
	ctx, cancel := n.callCtx(ctx)
	defer cancel()
	code, err := n.rpc.Remove(ctx, key, force, n.opts.Tenant)
	if err != nil {
		return rpcCode(err)
	}
	return Code(code)
}

// Segments lists the pool's segments from the master's admin API when AdminURL is set, else
// this client's own segment (its used bytes unknown, reported as 0).
func (n *Native) Segments(ctx context.Context) ([]pool.Segment, error) {
	admin := n.admin.Load()
	if admin == nil {
		if n.seg.Name == "" {
			return nil, nil
		}
		return []pool.Segment{{Name: n.seg.Name, Capacity: int64(n.seg.Size)}}, nil
	}
	names, err := admin.AllSegments(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]pool.Segment, 0, len(names))
	for _, name := range names {
		s, err := admin.QuerySegment(ctx, name)
		if errors.Is(err, ErrSegmentNotFound) {
			continue // unmounted between the two calls
		}
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Stats returns this client's counters and, from Segments and (with AdminURL) the master's
// metrics, the pool's capacity, occupancy and object count.
func (n *Native) Stats(ctx context.Context) (pool.Stats, error) {
	st := pool.Stats{
		Hits:            n.stats.hits.Load(),
		Misses:          n.stats.misses.Load(),
		Puts:            n.stats.puts.Load(),
		SkippedExisting: n.stats.skipped.Load(),
		PutFailures:     n.stats.putFailures.Load(),
		BytesIn:         n.stats.bytesIn.Load(),
		BytesOut:        n.stats.bytesOut.Load(),
		ChecksumErrors:  n.stats.checksumErrors.Load(),
		Detail:          map[string]int64{StatExistProbes: n.stats.existProbes.Load()},
	}
	segs, err := n.Segments(ctx)
	if err != nil {
		return st, err
	}
	for _, s := range segs {
		st.CapacityBytes += s.Capacity
		st.UsedBytes += s.Used
	}
	if admin := n.admin.Load(); admin != nil {
		m, err := admin.Metrics(ctx)
		if err != nil {
			return st, err
		}
		if v, ok := m.Value("master_key_count"); ok {
			st.Objects = int64(v)
		}
		if v, ok := m.Value("master_soft_pin_key_count"); ok {
			st.Detail[StatSoftPinned] = int64(v)
		}
	}
	return st, nil
}

// Fetch reads one object whole, whatever its size, through the data path: ErrObjectNotFound
// when the pool does not hold it, ErrInvalidParams when it is larger than limit bytes.
func (n *Native) Fetch(ctx context.Context, key string, limit int64) ([]byte, Code) {
	ctx, cancel := n.callCtx(ctx)
	defer cancel()
	lists, err := n.rpc.BatchGetReplicaList(ctx, []string{key}, n.opts.Tenant)
	if err != nil {
		return nil, rpcCode(err)
	}
	if lists[0].Code != 0 {
		return nil, Code(lists[0].Code)
	}
	rep, ok := readable(lists[0].List.Replicas)
	if !ok {
		return nil, ErrReplicaNotReady
	}
	if rep.Size > uint64(limit) {
		return nil, ErrInvalidParams
	}
	buf := make([]byte, rep.Size)
	if err := n.transfer(ctx, rep, [][]byte{buf}, false); err != nil {
		n.log.Warn("mooncake fetch transfer failed", "key", key, "segment", rep.Endpoint, "err", err)
		return nil, ErrRPCFail
	}
	if !n.checksumOK(key, rep, lists[0].List, [][]byte{buf}) {
		n.removePoisoned(ctx, key)
		return nil, ErrMooncakeChecksum
	}
	n.stats.hits.Add(1)
	n.stats.bytesOut.Add(int64(rep.Size))
	return buf, OK
}

// ServiceReady returns the master's store protocol version.
func (n *Native) ServiceReady(ctx context.Context) (string, error) {
	ctx, cancel := n.callCtx(ctx)
	defer cancel()
	return n.rpc.ServiceReady(ctx)
}
