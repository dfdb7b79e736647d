package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/mooncake/masterrpc"
	"github.com/kvctl/kvctl/pool"
)

// ErrNotMounted is returned by calls that need the cluster before the segment is mounted.
var ErrNotMounted = errors.New("not joined to the Mooncake cluster yet: the segment is not mounted")

// Options configure a Pool.
type Options struct {
	// Native is the client configuration: master, metadata server, admin URL, segment size,
	// host address, transfer address and call timeout.
	Native mooncake.NativeOptions
	// Logger receives mount events; nil discards them.
	Logger *slog.Logger
	// AdminDerived says Native.AdminURL was not given but derived from the master's host and
	// mooncake_master's default admin port: an admin server found to serve another master is
	// then dropped with a warning, where a given one fails Mount (ErrForeignAdmin).
	AdminDerived bool
}

// ErrForeignAdmin is wrapped by Mount's error when the master admin address serves another
// master than the one this host mounted its segment with: it answers, but does not list this
// host's segment under the id the segment was mounted with.
var ErrForeignAdmin = errors.New("the master admin address serves another master")

// Pool is a Mooncake cluster as the daemon serves from it. It implements pool.Pool and
// the daemon's Mounter and Pinger hooks. It is safe for concurrent use.
type Pool struct {
	opts  Options
	log   *slog.Logger
	probe *masterrpc.Client
	admin *mooncake.AdminClient

	mu     sync.RWMutex
	native *mooncake.Native
	closed bool

	adminWarn sync.Once
	// foreign is the error of a given admin address found to serve another master; Mount
	// returns it until the daemon is restarted with the right one.
	foreign error
	// outage is set when a ping failed: the remount count then, and when the first Mount
	// after it began, so that Mount waits for the segment to be back.
	outage struct {
		active   bool
		remounts int64
		since    time.Time
	}
}

// New returns a Pool that joins the cluster on its first successful Mount. It dials nothing.
func New(opts Options) (*Pool, error) {
	if opts.Native.MasterAddr == "" {
		return nil, errors.New("cluster: no master address")
	}
	if opts.Native.MetadataURL == "" {
		return nil, errors.New("cluster: no metadata server")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Pool{opts: opts, log: log,
		probe: masterrpc.New(masterrpc.Options{Addr: opts.Native.MasterAddr, CallTimeout: opts.Native.CallTimeout,
			DialTimeout: opts.Native.CallTimeout, MaxBackoff: 500 * time.Millisecond, Conns: 1})}
	if opts.Native.AdminURL != "" {
		a, err := mooncake.NewAdminClient(opts.Native.AdminURL, nil)
		if err != nil {
			return nil, fmt.Errorf("cluster: master admin URL: %w", err)
		}
		p.admin = a
	}
	return p, nil
}

func (p *Pool) client() *mooncake.Native {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.native
}

// Ping asks the master whether it serves (its ServiceReady call).
func (p *Pool) Ping(ctx context.Context) error {
	_, err := p.probe.ServiceReady(ctx)
	if err != nil {
		p.mu.Lock()
		if !p.outage.active && p.native != nil {
			p.outage.active, p.outage.remounts, p.outage.since = true, p.native.Remounts(), time.Time{}
		}
		p.mu.Unlock()
	}
	return err
}

// Mount joins the cluster: the first time it starts the Transfer Engine server, publishes the
// segment on the metadata server and mounts it with the master. Later calls (after the master
// was unreachable) succeed once the master lists the segment again; the client's heartbeat
// remounts it on a master that lost it.
func (p *Pool) Mount(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("cluster: closed")
	}
	n := p.native
	if n == nil {
		var err error
		n, err = mooncake.NewNative(ctx, p.opts.Native)
		if err != nil {
			p.mu.Unlock()
			return err
		}
		p.native = n
		p.mu.Unlock()
		p.log.Info("joined the Mooncake cluster", "master", p.opts.Native.MasterAddr, "segment", n.SegmentName(), "bytes", p.opts.Native.SegmentSize)
		return p.checkAdmin(ctx, n)
	}
	if p.foreign != nil {
		err := p.foreign
		p.mu.Unlock()
		return err
	}
	if !p.outage.active || n.SegmentName() == "" {
		p.mu.Unlock()
		return nil
	}
	if p.outage.since.IsZero() {
		p.outage.since = time.Now()
	}
	remounts, grace := p.outage.remounts, p.outage.since.Add(2*p.heartbeat())
	p.mu.Unlock()
	// Wait for the heartbeat's remount: the master must list the segment again. Without an
	// admin server that answers, wait for the client to report a remount since the outage,
	// for at most two heartbeats (a master that only lost the connection still has the
	// segment).
	back := func() error {
		p.mu.Lock()
		p.outage.active = false
		p.mu.Unlock()
		return nil
	}
	for {
		if p.admin != nil {
			_, err := p.admin.QuerySegment(ctx, n.SegmentName())
			if err == nil {
				return back()
			}
			if !errors.Is(err, mooncake.ErrSegmentNotFound) {
				p.warnAdmin(err)
				if n.Remounts() > remounts || time.Now().After(grace) {
					return back()
				}
			}
		} else if n.Remounts() > remounts || time.Now().After(grace) {
			return back()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("segment %s is not mounted again yet: %w", n.SegmentName(), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *Pool) heartbeat() time.Duration {
	if p.opts.Native.Heartbeat > 0 {
		return p.opts.Native.Heartbeat
	}
	return time.Second
}

// checkAdmin asks the admin server, right after the segment was mounted over RPC, whether it
// lists the segment under the id it was mounted with (random for each client). One that
// answers without it serves another master (another cluster's on MASTER-HOST:9003, or a
// mistyped address): its readiness and capacity would be another cluster's. A derived address
// is then dropped with a warning; a given one is refused: Mount fails with ErrForeignAdmin. An
// admin server that does not answer is only warned about (warnAdmin).
func (p *Pool) checkAdmin(ctx context.Context, n *mooncake.Native) error {
	if p.admin == nil {
		return nil
	}
	segs, err := p.admin.SegmentsDetail(ctx)
	if err != nil {
		p.warnAdmin(err)
		return nil
	}
	want := n.SegmentID()
	id := fmt.Sprintf("%d-%d", want[0], want[1])
	listed := ""
	for _, s := range segs {
		if s.Name == n.SegmentName() {
			listed = s.ID
			if s.ID == id {
				return nil
			}
		}
	}
	what := "does not list this host's segment " + n.SegmentName()
	if listed != "" {
		what = fmt.Sprintf("lists this host's segment %s under id %s, not %s", n.SegmentName(), listed, id)
	}
	admin := p.opts.Native.AdminURL
	p.admin = nil
	n.DropAdmin()
	if p.opts.AdminDerived {
		p.log.Warn("the admin server at the master's host serves another master: not using it; give --master-admin for the cluster's segments and capacity",
			"admin", admin, "master", p.opts.Native.MasterAddr, "segments_listed", len(segs), "why", what)
		return nil
	}
	err = fmt.Errorf("--master-admin %s %s mounted with master %s (it lists %d segments): %w; give the admin address of master %s",
		admin, what, p.opts.Native.MasterAddr, len(segs), ErrForeignAdmin, p.opts.Native.MasterAddr)
	p.mu.Lock()
	p.foreign = err
	p.mu.Unlock()
	p.log.Error("refusing the master admin address", "err", err)
	return err
}

// warnAdmin reports, once, that the master's admin server does not answer: the cluster's
// segments and capacity are then unknown, and remounts are judged by the client alone.
func (p *Pool) warnAdmin(err error) {
	p.adminWarn.Do(func() {
		p.log.Warn("the master's admin server does not answer; give --master-admin for the cluster's segments and capacity",
			"admin", p.opts.Native.AdminURL, "err", err)
	})
}

// Unmount leaves the cluster: the segment is unmounted (the master drops the pages stored in
// it), its metadata removed and its server stopped. Data calls fail afterwards.
func (p *Pool) Unmount(context.Context) error {
	p.mu.Lock()
	n := p.native
	p.native, p.closed = nil, true
	p.mu.Unlock()
	if n == nil {
		return nil
	}
	return n.Close()
}

// Close leaves the cluster when still joined and closes the master probe.
func (p *Pool) Close() error {
	err := p.Unmount(context.Background())
	return errors.Join(err, p.probe.Close())
}

// SegmentName is this host's segment ("host:port"), or "" before it is mounted.
func (p *Pool) SegmentName() string {
	if n := p.client(); n != nil {
		return n.SegmentName()
	}
	return ""
}

// Remounts counts the times the segment was mounted again after the master lost it.
func (p *Pool) Remounts() int64 {
	if n := p.client(); n != nil {
		return n.Remounts()
	}
	return 0
}

// KeptAnswers counts the keys lookups answered from replica lists an earlier lookup kept,
// without asking the master (mooncake.Native.KeptAnswers).
func (p *Pool) KeptAnswers() int64 {
	if n := p.client(); n != nil {
		return n.KeptAnswers()
	}
	return 0
}

// SegmentServed counts what peers read from and wrote to this host's segment: the "backend"
// object's segment_served of /v1/stats.
func (p *Pool) SegmentServed() statsapi.SegmentServedJSON {
	n := p.client()
	if n == nil {
		return statsapi.SegmentServedJSON{}
	}
	st := n.SegmentServerStats()
	return statsapi.SegmentServedJSON{PeerReads: st.Reads, PeerWrites: st.Writes, BytesRead: st.BytesRead, BytesWritten: st.BytesWritten}
}

func failAll[T any](n int, v T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// BatchIsExist asks the master; before the segment is mounted every key fails.
func (p *Pool) BatchIsExist(ctx context.Context, keys []string) []int {
	if n := p.client(); n != nil {
		return n.BatchIsExist(ctx, keys)
	}
	return failAll(len(keys), int(pool.ErrRPCFail))
}

// BatchLocate is BatchIsExist that keeps each present page's replica list for the load that
// follows (mooncake.Native.BatchLocate); before the segment is mounted every key fails.
func (p *Pool) BatchLocate(ctx context.Context, keys []string) []int {
	if n := p.client(); n != nil {
		return n.BatchLocate(ctx, keys)
	}
	return failAll(len(keys), int(pool.ErrRPCFail))
}

// BatchPut stores through the cluster. Before the segment is mounted nothing is asked and every
// key answers ErrNotJoined: the page is not stored by this host, but whether another host
// stored it is unknown, so it is not counted as a failed put.
func (p *Pool) BatchPut(ctx context.Context, keys []string, bufs [][]byte, cfg pool.ReplicateConfig) []pool.Code {
	if n := p.client(); n != nil {
		return n.BatchPut(ctx, keys, bufs, cfg)
	}
	return failAll(len(keys), pool.ErrNotJoined)
}

// BatchGet reads from whichever segment holds each page; before the mount every key fails.
func (p *Pool) BatchGet(ctx context.Context, keys []string, bufs [][]byte) []int64 {
	if n := p.client(); n != nil {
		return n.BatchGet(ctx, keys, bufs)
	}
	return failAll(len(keys), int64(pool.ErrRPCFail))
}

// BatchPutPieces is BatchPut of values given as pieces (pool.PieceCopier): each replica is
// written from where the pieces lie, in one Transfer Engine request. Before the mount every
// key answers ErrNotJoined, as BatchPut's.
func (p *Pool) BatchPutPieces(ctx context.Context, keys []string, srcs [][][]byte, cfg pool.ReplicateConfig) []pool.Code {
	if n := p.client(); n != nil {
		return n.BatchPutPieces(ctx, keys, srcs, cfg)
	}
	return failAll(len(keys), pool.ErrNotJoined)
}

// BatchGetPieces is BatchGet into destinations given as pieces (pool.PieceCopier): each value
// is read in one Transfer Engine request straight into its pieces. Before the mount every key
// fails.
func (p *Pool) BatchGetPieces(ctx context.Context, keys []string, dsts [][][]byte) []int64 {
	if n := p.client(); n != nil {
		return n.BatchGetPieces(ctx, keys, dsts)
	}
	return failAll(len(keys), int64(pool.ErrRPCFail))
}

var _ pool.PieceCopier = (*Pool)(nil)

// Remove deletes one object through the master.
func (p *Pool) Remove(ctx context.Context, key string, force bool) pool.Code {
	if n := p.client(); n != nil {
		return n.Remove(ctx, key, force)
	}
	return pool.ErrRPCFail
}

// Segments lists every segment of the cluster (from the master's admin API).
func (p *Pool) Segments(ctx context.Context) ([]pool.Segment, error) {
	if n := p.client(); n != nil {
		return n.Segments(ctx)
	}
	return nil, ErrNotMounted
}

// Stats returns this host's client counters and the cluster's capacity and occupancy.
func (p *Pool) Stats(ctx context.Context) (pool.Stats, error) {
	if n := p.client(); n != nil {
		return n.Stats(ctx)
	}
	return pool.Stats{}, ErrNotMounted
}

// SegmentHealth reports the health state of the peer segments this host reads from.
func (p *Pool) SegmentHealth() mooncake.SegmentHealthStats {
	if n := p.client(); n != nil {
		return n.SegmentHealth()
	}
	return mooncake.SegmentHealthStats{}
}
