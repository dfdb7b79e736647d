package daemon

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// Malformed scheduler calls are the engine's mistake (or attack), so they are refused with
// InvalidArgument before they reach the connector, and what the connector refuses about a
// request's content is InvalidArgument too, never Internal.

// requestStatusOf is statusOf for errors about a call's content: what statusOf would call
// Internal is InvalidArgument here.
func requestStatusOf(err error) error {
	st := statusOf(err)
	if status.Code(st) == codes.Internal {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return st
}

// checkBlockIDs refuses page ids outside the engine's layout.
func checkBlockIDs(call, reqID string, e *engine, groups []*enginepb.BlockIDs) error {
	if len(groups) > len(e.layout.Groups) {
		return status.Errorf(codes.InvalidArgument, "%s: request %.64q: block ids for %d layer groups, the layout has %d", call, reqID, len(groups), len(e.layout.Groups))
	}
	for g, ids := range groups {
		slots := e.layout.Groups[g].Slots
		for _, id := range ids.GetIds() {
			if id < 0 || int(id) >= slots {
				return status.Errorf(codes.InvalidArgument, "%s: request %.64q: page %d of layer group %d is outside the registered %d slots", call, reqID, id, g, slots)
			}
		}
	}
	return nil
}

// checkAlloc refuses a malformed UpdateStateAfterAlloc.
func (d *Daemon) checkAlloc(ctx context.Context, req *enginepb.AllocRequest) error {
	e, err := d.lookupEngine(ctx, req.GetEngine())
	if err != nil {
		return err
	}
	if req.GetHonouredTokens() < 0 {
		return status.Errorf(codes.InvalidArgument, "update state after alloc: honoured_tokens %d is negative", req.GetHonouredTokens())
	}
	return checkBlockIDs("update state after alloc", req.GetRequestId(), e, req.GetBlockIdsByGroup())
}

// checkCancel refuses a CancelLoad with a range that is not a range.
func checkCancel(req *enginepb.CancelLoadRequest) error {
	if req.GetStart() < 0 || req.GetEnd() < req.GetStart() {
		return status.Errorf(codes.InvalidArgument, "cancel load: [%d, %d) is not a token range", req.GetStart(), req.GetEnd())
	}
	return nil
}

// checkBuildMetaShape refuses request data without an id, with negative positions or with
// page ids outside the layout.
func (d *Daemon) checkBuildMetaShape(ctx context.Context, req *enginepb.BuildMetaRequest) error {
	e, err := d.lookupEngine(ctx, req.GetEngine())
	if err != nil {
		return err
	}
	added := 0
	for _, set := range [][]*enginepb.RequestData{req.GetNewRequests(), req.GetCachedRequests()} {
		for _, r := range set {
			added += len(r.GetNewTokens())
			if r.GetId() == "" {
				return status.Error(codes.InvalidArgument, "build meta: a request has no id")
			}
			if r.GetComputedPosition() < 0 || r.GetNumScheduledTokens() < 0 {
				return status.Errorf(codes.InvalidArgument, "build meta: request %.64q: computed_position %d and num_scheduled_tokens %d must not be negative", r.GetId(), r.GetComputedPosition(), r.GetNumScheduledTokens())
			}
			if err := checkBlockIDs("build meta", r.GetId(), e, r.GetNewBlockIdsByGroup()); err != nil {
				return err
			}
		}
	}
	return d.sec.limits.checkTracked("build meta", e, "", added, false)
}

// checkLookupShape refuses computed tokens outside the prompt.
func checkLookupShape(req *enginepb.LookupRequest) error {
	// A request carries its prompt in one of the two token fields (engineapi.RequestFromPB refuses both).
	toks := len(req.GetRequest().GetTokens()) + len(req.GetRequest().GetTokensPacked())/engineapi.TokenBytes
	if n := req.GetNumComputedTokens(); int(n) > toks {
		return status.Errorf(codes.InvalidArgument, "lookup: num_computed_tokens %d is past the prompt's %d tokens", n, toks)
	}
	return nil
}
