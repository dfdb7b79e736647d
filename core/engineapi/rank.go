package engineapi

import (
	"context"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// RemoteRank is a connector.Rank over the engine API: every call is the RPC of the same name
// on a registered engine rank, its errors the daemon's gRPC status errors.
type RemoteRank struct {
	c      *Client
	engine string
	decl   connector.Declarations
	ref    *enginepb.EngineRef
}

var _ connector.Rank = (*RemoteRank)(nil)

// NewRemoteRank returns the rank resp registered over c, with role's reading of its
// declarations. A registration can be named only over the connection that made it, so c must
// be the client that called Register.
func NewRemoteRank(c *Client, resp *enginepb.RegisterResponse, role connector.Role) *RemoteRank {
	name := resp.GetEngine()
	return &RemoteRank{c: c, engine: name, decl: DeclarationsFromPB(resp.GetDeclarations(), role), ref: &enginepb.EngineRef{Engine: name}}
}

// Client returns the connection the rank calls over.
func (r *RemoteRank) Client() *Client { return r.c }

// Name implements connector.Rank: the registered engine name.
func (r *RemoteRank) Name() string { return r.engine }

// Declarations implements connector.Rank.
func (r *RemoteRank) Declarations() connector.Declarations { return r.decl }

// Lookup implements connector.Rank.
func (r *RemoteRank) Lookup(ctx context.Context, req connector.Request, numComputedTokens int) (int, bool, error) {
	resp, err := r.c.Lookup(ctx, &enginepb.LookupRequest{Engine: r.engine, Request: RequestToPB(req), NumComputedTokens: int32(numComputedTokens)})
	if err != nil {
		return 0, false, err
	}
	return int(resp.GetMatchedTokens()), resp.GetAsync(), nil
}

// AdmissionQuery implements connector.Rank.
func (r *RemoteRank) AdmissionQuery(ctx context.Context, req connector.Request, numComputedTokens int) (int, bool, error) {
	resp, err := r.c.AdmissionQuery(ctx, &enginepb.LookupRequest{Engine: r.engine, Request: RequestToPB(req), NumComputedTokens: int32(numComputedTokens)})
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

// DropBoundSaves implements connector.Rank.
func (r *RemoteRank) DropBoundSaves(ctx context.Context, ids []string) error {
	_, err := r.c.DropBoundSaves(ctx, &enginepb.DropRequest{Engine: r.engine, RequestIds: ids})
	return err
}
