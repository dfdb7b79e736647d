package daemon

import (
	"errors"
	"fmt"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

func layoutFromPB(l *enginepb.Layout) (kvmem.Layout, error) {
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

func requestFromPB(r *enginepb.Request) (connector.Request, error) {
	if r == nil {
		return connector.Request{}, errors.New("no request")
	}
	if r.GetId() == "" {
		return connector.Request{}, errors.New("request id is empty")
	}
	tokens, err := engineapi.RequestTokens(r)
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
	return out, nil
}

func blockIDsFromPB(bs []*enginepb.BlockIDs) [][]int {
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

func requestDataFromPB(rs []*enginepb.RequestData) []connector.RequestData {
	out := make([]connector.RequestData, 0, len(rs))
	for _, r := range rs {
		out = append(out, connector.RequestData{
			ID:                 r.GetId(),
			NewTokens:          r.GetNewTokens(),
			NewBlockIDsByGroup: blockIDsFromPB(r.GetNewBlockIdsByGroup()),
			ComputedPosition:   int(r.GetComputedPosition()),
			NumScheduledTokens: int(r.GetNumScheduledTokens()),
			Dummy:              r.GetDummy(),
		})
	}
	return out
}

func transfersToPB(ts []connector.RequestTransfers) []*enginepb.RequestTransfers {
	out := make([]*enginepb.RequestTransfers, 0, len(ts))
	for _, t := range ts {
		pt := &enginepb.RequestTransfers{RequestId: t.RequestID, Pages: make([]*enginepb.PageTransfer, 0, len(t.Pages))}
		for _, p := range t.Pages {
			h := p.Hash
			pt.Pages = append(pt.Pages, &enginepb.PageTransfer{Hash: h[:], Group: int32(p.Group), Page: int32(p.Page)})
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
			if len(p.GetHash()) != keys.HashSize {
				return nil, fmt.Errorf("request %s: page hash has %d bytes, want %d", t.GetRequestId(), len(p.GetHash()), keys.HashSize)
			}
			var h keys.Hash
			copy(h[:], p.GetHash())
			rt.Pages = append(rt.Pages, connector.PageTransfer{Hash: h, Group: int(p.GetGroup()), Page: int(p.GetPage())})
		}
		out = append(out, rt)
	}
	return out, nil
}

func metadataToPB(m connector.Metadata) *enginepb.Metadata {
	return &enginepb.Metadata{Loads: transfersToPB(m.Loads), Saves: transfersToPB(m.Saves), AsyncLoads: transfersToPB(m.AsyncLoads)}
}

func metadataFromPB(m *enginepb.Metadata) (connector.Metadata, error) {
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
	return out, nil
}

func schedulerOutput(req *enginepb.BuildMetaRequest) connector.SchedulerOutput {
	return connector.SchedulerOutput{
		NewRequests:    requestDataFromPB(req.GetNewRequests()),
		CachedRequests: requestDataFromPB(req.GetCachedRequests()),
		SubmittedSaves: req.GetSubmittedSaves(),
	}
}
