package engineapi

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/keys"
)

// Which message a FuzzConvertFromPB input is decoded as.
const (
	convRequest = iota
	convMetadata
	convLayout
	convBuildMeta
	convKinds
)

func sameRequest(a, b connector.Request) bool {
	norm := func(r connector.Request) connector.Request {
		if len(r.Tokens) == 0 {
			r.Tokens = nil
		}
		if len(r.Scope.Multimodal) == 0 {
			r.Scope.Multimodal = nil
		}
		if len(r.MMFeatures) == 0 {
			r.MMFeatures = nil
		}
		return r
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// FuzzConvertFromPB decodes arbitrary bytes as the engine API messages whose FromPB
// conversions check what a peer sent (Request, Metadata, Layout, BuildMetaRequest) and
// converts them. No input panics; a request is accepted only with an id, and a page transfer
// only with a 16- or 32-byte hash; whatever converts comes back equal through its ToPB
// conversion and FromPB again.
func FuzzConvertFromPB(f *testing.F) {
	salt, lora, name := "tenant", int64(7), "adapter"
	add := func(kind int, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(kind), b)
	}
	add(convRequest, &enginepb.Request{Id: "r1", TokensPacked: PackTokens(nil, []int64{1, 2, 3, 4})})
	add(convRequest, &enginepb.Request{Id: "r2", Tokens: []int64{5, 6}, CacheSalt: &salt, LoraTaskId: &lora,
		MultimodalDigests: [][]byte{make([]byte, keys.MultimodalDigestSize)}, HasMultimodal: true})
	add(convRequest, &enginepb.Request{Id: "r3", LoraName: &name, MmFeatures: []*enginepb.MMFeature{{Identifier: "img", Offset: 2, Length: 8}}, ContextOnly: true})
	add(convRequest, &enginepb.Request{Id: "bad", TokensPacked: []byte{1, 2, 3}})
	add(convRequest, &enginepb.Request{Id: "both", Tokens: []int64{1}, TokensPacked: PackTokens(nil, []int64{1})})
	add(convRequest, &enginepb.Request{Id: "mm", MultimodalDigests: [][]byte{{1, 2}}})
	add(convRequest, &enginepb.Request{TokensPacked: PackTokens(nil, []int64{1})})
	add(convMetadata, MetadataToPB(connector.Metadata{
		Loads:      []connector.RequestTransfers{{RequestID: "a", Pages: []connector.PageTransfer{{Hash: keys.PageHashOf(keys.Hash{1}), Group: 0, Page: 3}}}},
		Saves:      []connector.RequestTransfers{{RequestID: "b"}},
		EarlyLoads: []string{"a"},
	}))
	add(convMetadata, &enginepb.Metadata{AsyncLoads: []*enginepb.RequestTransfers{{RequestId: "c", Pages: []*enginepb.PageTransfer{{Hash: make([]byte, 20)}}}}})
	add(convLayout, &enginepb.Layout{TokensPerBlock: 32, Groups: []*enginepb.LayerGroup{{Id: 0, Slots: 1024,
		Regions: []*enginepb.Region{{Offset: 0, Stride: 1 << 20, Size: 1 << 19}}, ReplicatedRegions: []*enginepb.Region{{Offset: 1 << 30, Stride: 4096, Size: 4096}}}}})
	add(convBuildMeta, SchedulerOutputToPB("e", connector.SchedulerOutput{
		NewRequests:    []connector.RequestData{{ID: "n", NewTokens: []int64{1, 2}, NewBlockIDsByGroup: [][]int{{4, 5}}, NumScheduledTokens: 2}},
		CachedRequests: []connector.RequestData{{ID: "c", ComputedPosition: 64, NumScheduledTokens: 1}},
		SubmittedSaves: []string{"n"},
	}))
	f.Add(uint8(convRequest), []byte{0x0a, 0x01, 'x', 0x42, 0x03, 1, 2, 3})
	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		switch kind % convKinds {
		case convRequest:
			var m enginepb.Request
			if proto.Unmarshal(b, &m) != nil {
				return
			}
			r, err := RequestFromPB(&m)
			if err != nil {
				return
			}
			if r.ID == "" {
				t.Fatal("accepted a request without an id")
			}
			for _, d := range m.GetMultimodalDigests() {
				if len(d) != keys.MultimodalDigestSize {
					t.Fatalf("accepted a %d-byte multimodal digest", len(d))
				}
			}
			back, err := RequestFromPB(RequestToPB(r))
			if err != nil || !sameRequest(back, r) {
				t.Fatalf("request round trip: %+v\n%+v, %v", r, back, err)
			}
		case convMetadata:
			var m enginepb.Metadata
			if proto.Unmarshal(b, &m) != nil {
				return
			}
			md, err := MetadataFromPB(&m)
			if err != nil {
				return
			}
			for _, ts := range [][]connector.RequestTransfers{md.Loads, md.Saves, md.AsyncLoads} {
				for _, rt := range ts {
					for _, p := range rt.Pages {
						if p.Hash.Len() != keys.HashSize && p.Hash.Len() != keys.MaxDigestSize {
							t.Fatalf("accepted a %d-byte page hash", p.Hash.Len())
						}
					}
				}
			}
			back, err := MetadataFromPB(MetadataToPB(md))
			if err != nil || !reflect.DeepEqual(back, md) {
				t.Fatalf("metadata round trip: %+v\n%+v, %v", md, back, err)
			}
		case convLayout:
			var m enginepb.Layout
			if proto.Unmarshal(b, &m) != nil {
				return
			}
			l, err := LayoutFromPB(&m)
			if err != nil {
				t.Fatalf("a decoded layout refused: %v", err)
			}
			back, err := LayoutFromPB(LayoutToPB(l))
			if err != nil || !reflect.DeepEqual(back, l) {
				t.Fatalf("layout round trip: %+v\n%+v, %v", l, back, err)
			}
		case convBuildMeta:
			var m enginepb.BuildMetaRequest
			if proto.Unmarshal(b, &m) != nil {
				return
			}
			out := SchedulerOutputFromPB(&m)
			if len(out.NewRequests) != len(m.GetNewRequests()) || len(out.CachedRequests) != len(m.GetCachedRequests()) {
				t.Fatal("scheduler output lost requests")
			}
			back := SchedulerOutputFromPB(SchedulerOutputToPB(m.GetEngine(), out))
			if !reflect.DeepEqual(back, out) {
				t.Fatalf("scheduler output round trip: %+v\n%+v", out, back)
			}
		}
	})
}
