package daemon

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// service implements the Engine gRPC service over the daemon's registered engines.
type service struct {
	enginepb.UnimplementedEngineServer
	d *Daemon
}

func (s *service) Register(ctx context.Context, req *enginepb.RegisterRequest) (*enginepb.RegisterResponse, error) {
	e, err := s.d.register(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &enginepb.RegisterResponse{Engine: e.name, Shard: e.shard, Declarations: engineapi.DeclarationsToPB(e.worker.Declarations()),
		ApiVersion: engineapi.APIVersion()}
	if e.attach != nil {
		out.SchedulerToken = e.attach.token
	}
	if e.order != nil {
		out.DaemonEvent = &enginepb.CudaEvent{Handle: e.order.Handle(), Device: req.GetEngineEvent().GetDevice()}
	}
	s.d.log.Info("engine registered", "engine", e.name, "model_key", e.modelKey, "shard", e.shard, "role", e.role, "scheduler", e.scheduler != nil)
	return out, nil
}

func (s *service) Unregister(ctx context.Context, req *enginepb.EngineRef) (*enginepb.Empty, error) {
	e, err := s.d.takeEngine(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	err = e.close(ctx)
	s.d.retire(e)
	if err != nil {
		return nil, statusOf(err)
	}
	s.d.log.Info("engine unregistered", "engine", e.name)
	return &enginepb.Empty{}, nil
}

func (s *service) Lookup(ctx context.Context, req *enginepb.LookupRequest) (*enginepb.LookupResponse, error) {
	return s.lookup(ctx, req, false)
}

func (s *service) AdmissionQuery(ctx context.Context, req *enginepb.LookupRequest) (*enginepb.LookupResponse, error) {
	return s.lookup(ctx, req, true)
}

func (s *service) lookup(ctx context.Context, req *enginepb.LookupRequest, admission bool) (*enginepb.LookupResponse, error) {
	sc, err := s.d.schedulerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	owned := false
	if pr := req.GetRequest(); pr.GetTokensArena() != nil {
		toks, aerr := s.d.arenaTokens(ctx, req.GetEngine(), pr)
		if aerr != nil {
			return nil, aerr
		}
		// From here on the request is as if the prompt had come in the repeated field, in a
		// slice nothing else holds: the scheduler may keep it.
		pr.TokensArena, pr.Tokens, owned = nil, toks, true
	}
	r, err := engineapi.RequestFromPB(req.GetRequest())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "lookup: %v", err)
	}
	r.TokensOwned = owned
	if err = s.d.checkLookup(scheduling(ctx), req.GetEngine(), r); err != nil {
		return nil, err
	}
	if req.GetNumComputedTokens() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "lookup: num_computed_tokens %d is negative", req.GetNumComputedTokens())
	}
	if err = checkLookupShape(req); err != nil {
		return nil, err
	}
	call := sc.Lookup
	if admission {
		call = sc.AdmissionQuery
	}
	began := time.Now()
	n, async, err := call(ctx, r, int(req.GetNumComputedTokens()))
	s.d.met.lookupDur.Observe(time.Since(began).Seconds())
	if err == nil && !admission {
		s.d.met.countLookup(len(r.Tokens), int(req.GetNumComputedTokens()), n)
	}
	if err != nil {
		return nil, requestStatusOf(err)
	}
	return &enginepb.LookupResponse{MatchedTokens: int32(n), Async: async}, nil
}

func (s *service) CancelLoad(ctx context.Context, req *enginepb.CancelLoadRequest) (*enginepb.Empty, error) {
	sc, err := s.d.schedulerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	if err := checkCancel(req); err != nil {
		return nil, err
	}
	if err := sc.CancelLoad(req.GetRequestId(), int(req.GetStart()), int(req.GetEnd())); err != nil {
		return nil, requestStatusOf(err)
	}
	return &enginepb.Empty{}, nil
}

func (s *service) UpdateStateAfterAlloc(ctx context.Context, req *enginepb.AllocRequest) (*enginepb.Empty, error) {
	sc, err := s.d.schedulerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	if err := s.d.checkAlloc(scheduling(ctx), req); err != nil {
		return nil, err
	}
	if err := sc.UpdateStateAfterAlloc(req.GetRequestId(), engineapi.BlockIDsFromPB(req.GetBlockIdsByGroup()), int(req.GetHonouredTokens()), req.GetDummy()); err != nil {
		return nil, requestStatusOf(err)
	}
	return &enginepb.Empty{}, nil
}

func (s *service) BuildMeta(ctx context.Context, req *enginepb.BuildMetaRequest) (*enginepb.Metadata, error) {
	sc, err := s.d.schedulerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	if err = s.d.checkBuildMeta(req); err != nil {
		return nil, err
	}
	if err = s.d.checkBuildMetaShape(scheduling(ctx), req); err != nil {
		return nil, err
	}
	out := engineapi.SchedulerOutputFromPB(req)
	m, err := sc.BuildMeta(out)
	if err != nil {
		return nil, requestStatusOf(err)
	}
	if e, err := s.d.lookupEngine(scheduling(ctx), req.GetEngine()); err == nil {
		e.offers.record(m)
	}
	return engineapi.MetadataToPB(m), nil
}

func (s *service) RequestFinished(ctx context.Context, req *enginepb.RequestRef) (*enginepb.RequestFinishedResponse, error) {
	sc, err := s.d.schedulerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	return &enginepb.RequestFinishedResponse{AsyncSaving: sc.RequestFinished(req.GetRequestId(), req.GetDummy())}, nil
}

func (s *service) RequestReset(ctx context.Context, req *enginepb.RequestRef) (*enginepb.Empty, error) {
	sc, err := s.d.schedulerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	sc.RequestReset(req.GetRequestId(), req.GetDummy())
	return &enginepb.Empty{}, nil
}

func (s *service) BindMeta(ctx context.Context, req *enginepb.BindMetaRequest) (*enginepb.Empty, error) {
	e, err := s.d.lookupEngine(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	m, err := engineapi.MetadataFromPB(req.GetMetadata())
	if err == nil {
		err = e.checkTransfers(m)
	}
	if err == nil {
		err = e.worker.CheckEarlyLoads(m.EarlyLoads)
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "bind metadata: %v", err)
	}
	if err := s.d.checkOffered(e, m); err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "bind metadata: %v", err)
	}
	e.worker.BindMeta(m)
	if len(m.Loads)+len(m.EarlyLoads) > 0 {
		// Over a call channel, once the reply is written: the GPU switches to the daemon while
		// the engine sends StartLoad. Over gRPC StartLoad wakes it itself.
		afterReply(ctx, e.worker.WakeForLoads)
	}
	return &enginepb.Empty{}, nil
}

func (s *service) StartLoad(ctx context.Context, req *enginepb.EngineRef) (*enginepb.Empty, error) {
	e, err := s.d.lookupEngine(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	w := e.worker
	prior := w.Err()
	if err := w.StartLoad(ctx); err != nil {
		return nil, s.protocolStatus(req.GetEngine(), prior, err)
	}
	if e.order != nil {
		// The copies are done: the engine's stream, waiting on this record, reads after them.
		if err := e.order.Signal(); err != nil {
			return nil, status.Errorf(codes.Internal, "start load: record the daemon's event: %v", err)
		}
	}
	return &enginepb.Empty{}, nil
}

func (s *service) WaitForSave(ctx context.Context, req *enginepb.EngineRef) (*enginepb.Empty, error) {
	w, err := s.d.workerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	if err := w.WaitForSave(ctx); err != nil {
		return nil, statusOf(err)
	}
	return &enginepb.Empty{}, nil
}

func (s *service) GetFinished(ctx context.Context, req *enginepb.GetFinishedRequest) (*enginepb.GetFinishedResponse, error) {
	w, err := s.d.workerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	wait := time.Duration(req.GetWaitMs()) * time.Millisecond
	if wait > connector.MaxFinishedWait {
		return nil, status.Errorf(codes.InvalidArgument, "get finished: wait_ms %d is above the limit of %d", req.GetWaitMs(), connector.MaxFinishedWait.Milliseconds())
	}
	prior := w.Err()
	saving, loading, err := w.GetFinishedWait(ctx, req.GetFinishedGen(), req.GetStartedLoading(), wait)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil, status.FromContextError(err).Err()
	}
	if err != nil {
		return nil, s.protocolStatus(req.GetEngine(), prior, err)
	}
	return &enginepb.GetFinishedResponse{FinishedSaving: saving, FinishedLoading: loading}, nil
}

func (s *service) TakeFailedLoads(ctx context.Context, req *enginepb.EngineRef) (*enginepb.RequestIDs, error) {
	w, err := s.d.workerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	return &enginepb.RequestIDs{Ids: w.TakeFailedLoadRequests()}, nil
}

func (s *service) TakeFailedAsyncLoads(ctx context.Context, req *enginepb.EngineRef) (*enginepb.RequestIDs, error) {
	w, err := s.d.workerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	return &enginepb.RequestIDs{Ids: w.TakeFailedAsyncLoadRequests()}, nil
}

func (s *service) TakeSubmittedSaves(ctx context.Context, req *enginepb.EngineRef) (*enginepb.RequestIDs, error) {
	// The scheduler takes the submitted saves into its next BuildMeta: an attached scheduler may.
	w, err := s.d.workerOf(scheduling(ctx), req.GetEngine())
	if err != nil {
		return nil, err
	}
	return &enginepb.RequestIDs{Ids: w.TakeSubmittedSaves()}, nil
}

func (s *service) DropBoundSaves(ctx context.Context, req *enginepb.DropRequest) (*enginepb.Empty, error) {
	w, err := s.d.workerOf(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	prior := w.Err()
	if err := w.DropBoundSaves(req.GetRequestIds()); err != nil {
		return nil, s.protocolStatus(req.GetEngine(), prior, err)
	}
	return &enginepb.Empty{}, nil
}
