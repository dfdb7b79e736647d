package engineapi

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// The conversions between the engine API's messages and the connector's types, shared by the
// daemon's server and the clients (RemoteRank). A FromPB conversion validates what a peer sent;
// a ToPB conversion trusts the caller's values.

// LayoutFromPB converts a registered KV layout. It checks only that one was sent; the caller
// validates it against the engine memory.
func LayoutFromPB(l *enginepb.Layout) (kvmem.Layout, error) {
	if l == nil {
		return kvmem.Layout{}, errors.New("no KV layout")
	}
	out := kvmem.Layout{TokensPerBlock: int(l.GetTokensPerBlock())}
	for _, g := range l.GetGroups() {
		out.Groups = append(out.Groups, kvmem.GroupLayout{
			ID:                int(g.GetId()),
			Slots:             int(g.GetSlots()),
			Regions:           regionsFromPB(g.GetRegions()),
			ReplicatedRegions: regionsFromPB(g.GetReplicatedRegions()),
		})
	}
	return out, nil
}

func regionsFromPB(rs []*enginepb.Region) []kvmem.Region {
	out := make([]kvmem.Region, 0, len(rs))
	for _, r := range rs {
		out = append(out, kvmem.Region{Offset: r.GetOffset(), Stride: r.GetStride(), Size: r.GetSize()})
	}
	return out
}

// LayoutToPB converts a KV layout for Register.
func LayoutToPB(l kvmem.Layout) *enginepb.Layout {
	out := &enginepb.Layout{TokensPerBlock: int32(l.TokensPerBlock)}
	for _, g := range l.Groups {
		out.Groups = append(out.Groups, &enginepb.LayerGroup{
			Id: int32(g.ID), Slots: int32(g.Slots),
			Regions: regionsToPB(g.Regions), ReplicatedRegions: regionsToPB(g.ReplicatedRegions),
		})
	}
	return out
}

func regionsToPB(rs []kvmem.Region) []*enginepb.Region {
	var out []*enginepb.Region
	for _, r := range rs {
		out = append(out, &enginepb.Region{Offset: r.Offset, Stride: r.Stride, Size: r.Size})
	}
	return out
}

// RequestFromPB converts a looked-up request, refusing one without an id, with malformed
// tokens or with a multimodal digest of the wrong size.
func RequestFromPB(r *enginepb.Request) (connector.Request, error) {
	if r == nil {
		return connector.Request{}, errors.New("no request")
	}
	if r.GetId() == "" {
		return connector.Request{}, errors.New("request id is empty")
	}
	tokens, err := RequestTokens(r)
	if err != nil {
		return connector.Request{}, err
	}
	out := connector.Request{
		ID:            r.GetId(),
		Tokens:        tokens,
		HasMultimodal: r.GetHasMultimodal(),
		Dummy:         r.GetDummy(),
		ContextOnly:   r.GetContextOnly(),
	}
	if r.CacheSalt != nil {
		s := r.GetCacheSalt()
		out.Scope.CacheSalt = &s
	}
	if r.LoraTaskId != nil {
		id := r.GetLoraTaskId()
		out.Scope.LoRATaskID = &id
	}
	for i, d := range r.GetMultimodalDigests() {
		if len(d) != keys.MultimodalDigestSize {
			return out, fmt.Errorf("multimodal digest %d has %d bytes, want %d", i, len(d), keys.MultimodalDigestSize)
		}
		var dd [keys.MultimodalDigestSize]byte
		copy(dd[:], d)
		out.Scope.Multimodal = append(out.Scope.Multimodal, dd)
	}
	if r.LoraName != nil {
		n := r.GetLoraName()
		out.LoRAName = &n
	}
	if r.LoraPath != nil {
		n := r.GetLoraPath()
		out.LoRAPath = &n
	}
	for _, f := range r.GetMmFeatures() {
		out.MMFeatures = append(out.MMFeatures, keys.MMFeature{Identifier: f.GetIdentifier(), Offset: int(f.GetOffset()), Length: int(f.GetLength())})
	}
	return out, nil
}

// RequestToPB converts a request for Lookup or AdmissionQuery. Its tokens travel packed in a
// view of r.Tokens (TokensView), which must not change until the call returns.
func RequestToPB(r connector.Request) *enginepb.Request {
	out := &enginepb.Request{
		Id:            r.ID,
		TokensPacked:  TokensView(r.Tokens),
		CacheSalt:     r.Scope.CacheSalt,
		LoraTaskId:    r.Scope.LoRATaskID,
		HasMultimodal: r.HasMultimodal,
		Dummy:         r.Dummy,
		ContextOnly:   r.ContextOnly,
	}
	for _, d := range r.Scope.Multimodal {
		out.MultimodalDigests = append(out.MultimodalDigests, d[:])
	}
	out.LoraName, out.LoraPath = r.LoRAName, r.LoRAPath
	for _, f := range r.MMFeatures {
		out.MmFeatures = append(out.MmFeatures, &enginepb.MMFeature{Identifier: f.Identifier, Offset: int32(f.Offset), Length: int32(f.Length)})
	}
	return out
}

// BlockIDsFromPB converts per-group page lists.
func BlockIDsFromPB(bs []*enginepb.BlockIDs) [][]int {
	out := make([][]int, len(bs))
	for i, b := range bs {
		ids := make([]int, len(b.GetIds()))
		for j, id := range b.GetIds() {
			ids[j] = int(id)
		}
		out[i] = ids
	}
	return out
}

// BlockIDsToPB converts per-group page lists.
func BlockIDsToPB(pages [][]int) []*enginepb.BlockIDs {
	out := make([]*enginepb.BlockIDs, len(pages))
	for g, p := range pages {
		ids := make([]int32, len(p))
		for i, id := range p {
			ids[i] = int32(id)
		}
		out[g] = &enginepb.BlockIDs{Ids: ids}
	}
	return out
}

func requestDataFromPB(rs []*enginepb.RequestData) []connector.RequestData {
	out := make([]connector.RequestData, 0, len(rs))
	for _, r := range rs {
		out = append(out, connector.RequestData{
			ID:                 r.GetId(),
			NewTokens:          r.GetNewTokens(),
			NewBlockIDsByGroup: BlockIDsFromPB(r.GetNewBlockIdsByGroup()),
			ComputedPosition:   int(r.GetComputedPosition()),
			NumScheduledTokens: int(r.GetNumScheduledTokens()),
			Dummy:              r.GetDummy(),
		})
	}
	return out
}

func requestDataToPB(rs []connector.RequestData) []*enginepb.RequestData {
	var out []*enginepb.RequestData
	for _, r := range rs {
		out = append(out, &enginepb.RequestData{
			Id:                 r.ID,
			NewTokens:          r.NewTokens,
			NewBlockIdsByGroup: BlockIDsToPB(r.NewBlockIDsByGroup),
			ComputedPosition:   int32(r.ComputedPosition),
			NumScheduledTokens: int32(r.NumScheduledTokens),
			Dummy:              r.Dummy,
		})
	}
	return out
}

// SchedulerOutputFromPB converts a BuildMeta call's scheduler output.
func SchedulerOutputFromPB(req *enginepb.BuildMetaRequest) connector.SchedulerOutput {
	return connector.SchedulerOutput{
		NewRequests:    requestDataFromPB(req.GetNewRequests()),
		CachedRequests: requestDataFromPB(req.GetCachedRequests()),
		SubmittedSaves: req.GetSubmittedSaves(),
	}
}

// SchedulerOutputToPB converts a scheduler output into engine's BuildMeta call.
func SchedulerOutputToPB(engine string, out connector.SchedulerOutput) *enginepb.BuildMetaRequest {
	return &enginepb.BuildMetaRequest{
		Engine:         engine,
		NewRequests:    requestDataToPB(out.NewRequests),
		CachedRequests: requestDataToPB(out.CachedRequests),
		SubmittedSaves: out.SubmittedSaves,
	}
}

func transfersToPB(ts []connector.RequestTransfers) []*enginepb.RequestTransfers {
	out := make([]*enginepb.RequestTransfers, 0, len(ts))
	for _, t := range ts {
		pt := &enginepb.RequestTransfers{RequestId: t.RequestID, Pages: make([]*enginepb.PageTransfer, 0, len(t.Pages))}
		for _, p := range t.Pages {
			pt.Pages = append(pt.Pages, &enginepb.PageTransfer{Hash: p.Hash.Bytes(), Group: int32(p.Group), Page: int32(p.Page)})
		}
		out = append(out, pt)
	}
	return out
}

func transfersFromPB(ts []*enginepb.RequestTransfers) ([]connector.RequestTransfers, error) {
	out := make([]connector.RequestTransfers, 0, len(ts))
	for _, t := range ts {
		rt := connector.RequestTransfers{RequestID: t.GetRequestId(), Pages: make([]connector.PageTransfer, 0, len(t.GetPages()))}
		for _, p := range t.GetPages() {
			h, err := keys.ParsePageHash(p.GetHash())
			if err != nil {
				return nil, fmt.Errorf("request %s: page %w", t.GetRequestId(), err)
			}
			rt.Pages = append(rt.Pages, connector.PageTransfer{Hash: h, Group: int(p.GetGroup()), Page: int(p.GetPage())})
		}
		out = append(out, rt)
	}
	return out, nil
}

// MetadataToPB converts a pass's metadata.
func MetadataToPB(m connector.Metadata) *enginepb.Metadata {
	return &enginepb.Metadata{Loads: transfersToPB(m.Loads), Saves: transfersToPB(m.Saves), AsyncLoads: transfersToPB(m.AsyncLoads), EarlyLoads: slices.Clone(m.EarlyLoads)}
}

// MetadataFromPB converts a pass's metadata, refusing a page hash of the wrong size.
func MetadataFromPB(m *enginepb.Metadata) (connector.Metadata, error) {
	var out connector.Metadata
	var err error
	if out.Loads, err = transfersFromPB(m.GetLoads()); err != nil {
		return out, err
	}
	if out.Saves, err = transfersFromPB(m.GetSaves()); err != nil {
		return out, err
	}
	if out.AsyncLoads, err = transfersFromPB(m.GetAsyncLoads()); err != nil {
		return out, err
	}
	out.EarlyLoads = slices.Clone(m.GetEarlyLoads())
	return out, nil
}

// DeclarationsToPB converts a connector's declarations for RegisterResponse: every name,
// spelled as connector.Declarations.Map spells it, with its value.
func DeclarationsToPB(d connector.Declarations) map[string]bool {
	out := map[string]bool{}
	for k, v := range d.Map() {
		if b, ok := v.(bool); ok {
			out[k] = b
		}
	}
	return out
}

// DeclarationsFromPB reads RegisterResponse's declarations under the manager's rules for role
// (connector.ReadDeclarations).
func DeclarationsFromPB(m map[string]bool, role connector.Role) connector.Declarations {
	raw := make(map[string]any, len(m))
	for k, v := range m {
		raw[k] = v
	}
	return connector.ReadDeclarations(raw, role)
}
