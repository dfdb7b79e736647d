package daemon

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// An engine may run its scheduler in another process than its workers (vLLM does: the engine
// core schedules, the TP workers run the model). Such a scheduler attaches to the rank that
// registered with scheduler = true: it presents the scheduler token the registration returned,
// from a process of the same uid, and its connection may then make the scheduler calls naming
// that rank. Worker calls (loads, saves, completions) and Unregister stay with the registering
// connection, so an attached scheduler cannot move pages of engine memory it does not own.

// maxAttached bounds the connections attached to one rank's scheduler: an engine has one
// scheduler process, a restart briefly two.
const maxAttached = 4

// schedulerAttachments is one scheduler rank's token and the connections attached to it.
type schedulerAttachments struct {
	token string
	mu    sync.Mutex
	conns map[uint64]bool
}

func newSchedulerAttachments() (*schedulerAttachments, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	return &schedulerAttachments{token: hex.EncodeToString(b[:]), conns: map[uint64]bool{}}, nil
}

func (a *schedulerAttachments) has(conn uint64) bool {
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conns[conn]
}

// detach forgets conn (a connection that ended).
func (a *schedulerAttachments) detach(conn uint64) {
	if a == nil {
		return
	}
	a.mu.Lock()
	delete(a.conns, conn)
	a.mu.Unlock()
}

type schedulingKey struct{}

// scheduling marks ctx as a scheduler call: an attached connection may make it.
func scheduling(ctx context.Context) context.Context {
	return context.WithValue(ctx, schedulingKey{}, true)
}

// mayUse refuses a call from a connection that neither registered e nor, for a scheduler call,
// attached to its scheduler.
func (e *engine) mayUse(ctx context.Context) error {
	conn := connOf(ctx)
	if e.conn == conn {
		return nil
	}
	if sched, _ := ctx.Value(schedulingKey{}).(bool); sched && e.attach.has(conn) {
		return nil
	}
	if e.attach.has(conn) {
		return status.Errorf(codes.PermissionDenied, "engine %q: this connection attached to its scheduler; worker calls and Unregister belong to the connection that registered it", e.name)
	}
	return e.ownedBy(conn)
}

func (s *service) AttachScheduler(ctx context.Context, req *enginepb.AttachSchedulerRequest) (*enginepb.AttachSchedulerResponse, error) {
	e, err := s.d.attachScheduler(ctx, req)
	if err != nil {
		return nil, err
	}
	s.d.log.Info("scheduler attached", "engine", e.name, "uid", uidOf(ctx))
	return &enginepb.AttachSchedulerResponse{Engine: e.name, Shard: e.shard, Declarations: engineapi.DeclarationsToPB(e.worker.Declarations())}, nil
}

func (d *Daemon) attachScheduler(ctx context.Context, req *enginepb.AttachSchedulerRequest) (*engine, error) {
	name, token := req.GetEngine(), req.GetSchedulerToken()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "attach scheduler: no engine named")
	}
	if len(name) > 4096 || len(token) > 256 {
		return nil, status.Errorf(codes.InvalidArgument, "attach scheduler: engine name of %d bytes or token of %d bytes is too long", len(name), len(token))
	}
	d.mu.RLock()
	e := d.engines[name]
	d.mu.RUnlock()
	if e == nil {
		return nil, status.Errorf(codes.NotFound, "attach scheduler: engine %q is not registered", name)
	}
	if e.attach == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "attach scheduler: engine %q registered without the scheduler adapter (scheduler = false)", name)
	}
	conn := connOf(ctx)
	if conn == e.conn {
		return nil, status.Errorf(codes.FailedPrecondition, "attach scheduler: this connection registered engine %q and drives its scheduler already", name)
	}
	if uid := uidOf(ctx); uid < 0 || uid != e.deploy.uid {
		return nil, status.Errorf(codes.PermissionDenied, "attach scheduler: the caller runs as uid %d, engine %q was registered by uid %d; a scheduler attaches only to ranks of its own uid", uid, name, e.deploy.uid)
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(e.attach.token)) != 1 {
		return nil, status.Errorf(codes.PermissionDenied, "attach scheduler: wrong scheduler token for engine %q (use the one its RegisterResponse returned)", name)
	}
	a := e.attach
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.conns[conn] && len(a.conns) >= maxAttached {
		return nil, status.Errorf(codes.ResourceExhausted, "attach scheduler: engine %q has %d attached schedulers, the limit", name, len(a.conns))
	}
	a.conns[conn] = true
	return e, nil
}

// connDetached forgets connection id on every scheduler it attached to.
func (d *Daemon) connDetached(id uint64) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, e := range d.engines {
		e.attach.detach(id)
	}
}
