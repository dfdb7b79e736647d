package engineapi

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// RemoteRank is a connector.Rank over the engine API: every call is the RPC of the same name
// on a registered engine rank, its errors the daemon's gRPC status errors.
//
// Lookup and AdmissionQuery pass the prompt through a prompt arena when they can: on the first
// one the rank creates an arena (RemoteRankOptions.PromptArenaBytes), registers it with the
// daemon and from then on writes each prompt into a free range of it and sends only the range.
// A daemon that refuses the arena (an older one answers Unimplemented) turns it off for the
// rank; a prompt that does not fit in the free part of the arena goes in tokens_packed.
type RemoteRank struct {
	c      *Client
	engine string
	decl   connector.Declarations
	ref    *enginepb.EngineRef
	opts   RemoteRankOptions

	arenaMu    sync.Mutex
	arenaState int
	arena      *PromptArena
	arenaErr   error

	viaArena, viaPacked atomic.Uint64
}

// RemoteRankOptions tunes a RemoteRank. The zero value is the default.
type RemoteRankOptions struct {
	// NoPromptArena sends every prompt in tokens_packed and never creates a prompt arena.
	NoPromptArena bool
	// PromptArenaBytes is the size of the prompt arena (DefaultPromptArenaBytes when zero).
	PromptArenaBytes int64
}

const (
	arenaUntried = iota
	arenaReady
	arenaOff
)

// ErrNoPromptArena is what PromptArena reports for a rank whose options turned the arena off.
var ErrNoPromptArena = errors.New("prompt arena turned off")

var _ connector.Rank = (*RemoteRank)(nil)

// NewRemoteRank returns the rank resp registered over c, with role's reading of its
// declarations and the default options. A registration can be named only over the connection
// that made it, so c must be the client that called Register.
func NewRemoteRank(c *Client, resp *enginepb.RegisterResponse, role connector.Role) *RemoteRank {
	return NewRemoteRankWith(c, resp, role, RemoteRankOptions{})
}

// NewRemoteRankWith is NewRemoteRank with options.
func NewRemoteRankWith(c *Client, resp *enginepb.RegisterResponse, role connector.Role, opts RemoteRankOptions) *RemoteRank {
	name := resp.GetEngine()
	r := &RemoteRank{c: c, engine: name, decl: DeclarationsFromPB(resp.GetDeclarations(), role), ref: &enginepb.EngineRef{Engine: name}, opts: opts}
	if opts.NoPromptArena {
		r.arenaState, r.arenaErr = arenaOff, ErrNoPromptArena
	}
	return r
}

// PromptArena returns the rank's prompt arena, setting it up first if no lookup has yet, or nil
// and the reason the rank sends its prompts packed instead (ErrNoPromptArena, or the daemon's
// refusal).
func (r *RemoteRank) PromptArena(ctx context.Context) (*PromptArena, error) {
	r.arenaMu.Lock()
	defer r.arenaMu.Unlock()
	switch r.arenaState {
	case arenaReady:
		return r.arena, nil
	case arenaOff:
		return nil, r.arenaErr
	}
	size := r.opts.PromptArenaBytes
	if size <= 0 {
		size = DefaultPromptArenaBytes
	}
	a, err := NewPromptArena(size)
	if err == nil {
		if err = r.c.RegisterPromptArena(ctx, r.engine, a); err != nil {
			_ = a.Close()
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			// Refused for good (or the machine cannot make one): packed from now on. A call
			// cut short by its own context tries again next time.
			r.arenaState, r.arenaErr = arenaOff, err
		}
		return nil, err
	}
	r.c.adopt(a)
	r.arena, r.arenaState = a, arenaReady
	return a, nil
}

// PromptCounts returns how many Lookup and AdmissionQuery calls sent their prompt through the
// prompt arena and how many in tokens_packed (an empty prompt counts as packed).
func (r *RemoteRank) PromptCounts() (arena, packed uint64) {
	return r.viaArena.Load(), r.viaPacked.Load()
}

// lookupRequest builds the LookupRequest of req, its prompt in a range of the arena when one is
// in use and has room, and the function to call with the RPC's error once it returned.
func (r *RemoteRank) lookupRequest(ctx context.Context, req connector.Request, numComputedTokens int) (*enginepb.LookupRequest, func(error)) {
	pb := RequestToPB(req)
	lr := &enginepb.LookupRequest{Engine: r.engine, Request: pb, NumComputedTokens: int32(numComputedTokens)}
	packed := func(error) { r.viaPacked.Add(1) }
	if len(req.Tokens) == 0 {
		return lr, packed
	}
	a, _ := r.PromptArena(ctx)
	if a == nil {
		return lr, packed
	}
	off, ok := a.Alloc(uint64(len(req.Tokens)) * TokenBytes)
	if !ok {
		return lr, packed
	}
	if !a.Write(off, req.Tokens) {
		a.Free(off)
		return lr, packed
	}
	r.viaArena.Add(1)
	pb.TokensPacked = nil
	pb.TokensArena = &enginepb.ArenaRange{Offset: off, Count: uint64(len(req.Tokens))}
	return lr, func(err error) {
		switch status.Code(err) {
		case codes.Canceled, codes.DeadlineExceeded:
			// The call may still be running in the daemon, which may not have copied the
			// range yet: the range stays reserved rather than be overwritten under it.
			return
		}
		a.Free(off)
	}
}

// Client returns the connection the rank calls over.
func (r *RemoteRank) Client() *Client { return r.c }

// Name implements connector.Rank: the registered engine name.
func (r *RemoteRank) Name() string { return r.engine }

// Declarations implements connector.Rank.
func (r *RemoteRank) Declarations() connector.Declarations { return r.decl }

// Lookup implements connector.Rank.
func (r *RemoteRank) Lookup(ctx context.Context, req connector.Request, numComputedTokens int) (int, bool, error) {
	lr, done := r.lookupRequest(ctx, req, numComputedTokens)
	resp, err := r.c.Lookup(ctx, lr)
	done(err)
	if err != nil {
		return 0, false, err
	}
	return int(resp.GetMatchedTokens()), resp.GetAsync(), nil
}

// AdmissionQuery implements connector.Rank.
func (r *RemoteRank) AdmissionQuery(ctx context.Context, req connector.Request, numComputedTokens int) (int, bool, error) {
	lr, done := r.lookupRequest(ctx, req, numComputedTokens)
	resp, err := r.c.AdmissionQuery(ctx, lr)
	done(err)
	if err != nil {
		return 0, false, err
	}
	return int(resp.GetMatchedTokens()), resp.GetAsync(), nil
}

// CancelLoad implements connector.Rank.
func (r *RemoteRank) CancelLoad(ctx context.Context, reqID string, start, end int) error {
	_, err := r.c.CancelLoad(ctx, &enginepb.CancelLoadRequest{Engine: r.engine, RequestId: reqID, Start: int32(start), End: int32(end)})
	return err
}

// UpdateStateAfterAlloc implements connector.Rank.
func (r *RemoteRank) UpdateStateAfterAlloc(ctx context.Context, reqID string, blockIDsByGroup [][]int, honouredTokens int) error {
	_, err := r.c.UpdateStateAfterAlloc(ctx, &enginepb.AllocRequest{Engine: r.engine, RequestId: reqID, BlockIdsByGroup: BlockIDsToPB(blockIDsByGroup), HonouredTokens: int32(honouredTokens)})
	return err
}

// BuildMeta implements connector.Rank.
func (r *RemoteRank) BuildMeta(ctx context.Context, out connector.SchedulerOutput) (connector.Metadata, error) {
	m, err := r.c.BuildMeta(ctx, SchedulerOutputToPB(r.engine, out))
	if err != nil {
		return connector.Metadata{}, err
	}
	return MetadataFromPB(m)
}

// RequestFinished implements connector.Rank.
func (r *RemoteRank) RequestFinished(ctx context.Context, reqID string) (bool, error) {
	resp, err := r.c.RequestFinished(ctx, &enginepb.RequestRef{Engine: r.engine, RequestId: reqID})
	if err != nil {
		return false, err
	}
	return resp.GetAsyncSaving(), nil
}

// RequestReset implements connector.Rank.
func (r *RemoteRank) RequestReset(ctx context.Context, reqID string) error {
	_, err := r.c.RequestReset(ctx, &enginepb.RequestRef{Engine: r.engine, RequestId: reqID})
	return err
}

// BindMeta implements connector.Rank.
func (r *RemoteRank) BindMeta(ctx context.Context, meta connector.Metadata) error {
	_, err := r.c.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: r.engine, Metadata: MetadataToPB(meta)})
	return err
}

// StartLoad implements connector.Rank.
func (r *RemoteRank) StartLoad(ctx context.Context) error {
	_, err := r.c.StartLoad(ctx, r.ref)
	return err
}

// TakeFailedLoadRequests implements connector.Rank.
func (r *RemoteRank) TakeFailedLoadRequests(ctx context.Context) ([]string, error) {
	resp, err := r.c.TakeFailedLoads(ctx, r.ref)
	return resp.GetIds(), err
}

// TakeFailedAsyncLoadRequests implements connector.Rank.
func (r *RemoteRank) TakeFailedAsyncLoadRequests(ctx context.Context) ([]string, error) {
	resp, err := r.c.TakeFailedAsyncLoads(ctx, r.ref)
	return resp.GetIds(), err
}

// TakeSubmittedSaves implements connector.Rank.
func (r *RemoteRank) TakeSubmittedSaves(ctx context.Context) ([]string, error) {
	resp, err := r.c.TakeSubmittedSaves(ctx, r.ref)
	return resp.GetIds(), err
}

// WaitForSave implements connector.Rank.
func (r *RemoteRank) WaitForSave(ctx context.Context) error {
	_, err := r.c.WaitForSave(ctx, r.ref)
	return err
}

// GetFinished implements connector.Rank.
func (r *RemoteRank) GetFinished(ctx context.Context, finishedGen, startedLoading []string) ([]string, []string, error) {
	resp, err := r.c.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: r.engine, FinishedGen: finishedGen, StartedLoading: startedLoading})
	if err != nil {
		return nil, nil, err
	}
	return resp.GetFinishedSaving(), resp.GetFinishedLoading(), nil
}

// GetFinishedWait implements connector.FinishedWaiter: GetFinished with wait_ms, wait rounded
// up to a millisecond and capped at connector.MaxFinishedWait. A daemon older than wait_ms
// answers at once.
func (r *RemoteRank) GetFinishedWait(ctx context.Context, finishedGen, startedLoading []string, wait time.Duration) ([]string, []string, error) {
	ms := (min(max(wait, 0), connector.MaxFinishedWait) + time.Millisecond - 1) / time.Millisecond
	resp, err := r.c.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: r.engine, FinishedGen: finishedGen, StartedLoading: startedLoading, WaitMs: uint32(ms)})
	if err != nil {
		return nil, nil, err
	}
	return resp.GetFinishedSaving(), resp.GetFinishedLoading(), nil
}

// DropBoundSaves implements connector.Rank.
func (r *RemoteRank) DropBoundSaves(ctx context.Context, ids []string) error {
	_, err := r.c.DropBoundSaves(ctx, &enginepb.DropRequest{Engine: r.engine, RequestIds: ids})
	return err
}
