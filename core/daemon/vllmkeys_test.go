package daemon_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool/embedded"
)

// startEmbedded runs a daemon over an embedded pool the test keeps, to read its keys.
func startEmbedded(t *testing.T, poolBytes int64) (*daemontest.Running, *embedded.Embedded) {
	t.Helper()
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: poolBytes}}
	emb, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	r := daemontest.Start(t, daemon.Config{
		Backend:  &daemon.Backend{Pool: emb, Info: statsapi.BackendInfo{Kind: statsapi.BackendEmbedded}},
		Defaults: connector.Options{StagingBufferBytes: 8 << 20},
	})
	return r, emb
}

// A vLLM deployment on kvctl serve writes its pages under the keys vLLM's own
// MooncakeStoreConnector names (the scheme kvctl hash and probe-pool derive, pinned by the
// engine-keys vectors), loads them back byte for byte, and writes a key shared by TP ranks
// holding the same KV heads once.
func TestVLLMKeysThroughServe(t *testing.T) {
	const T, model = 16, "org/Tiny-Llama-1B"
	for _, tc := range []struct {
		format       string
		world, heads int
		keyRanks     int
		// shared: TP ranks share key ranks. vLLM's ranks that hold the same KV heads hold
		// the same bytes, and the simulated engine writes different bytes on every rank, so
		// its loads are not checked there.
		shared bool
	}{
		{"vllm", 2, 8, 2, false},
		{"vllm-xxhash-cbor", 4, 2, 2, true},
		{"vllm-xxhash", 1, 8, 1, false},
	} {
		t.Run(fmt.Sprintf("%s/tp%d", tc.format, tc.world), func(t *testing.T) {
			r, emb := startEmbedded(t, 128<<20)
			ctx := context.Background()
			kp := &enginepb.KeyParams{PythonHashSeed: proto.String("0"), Model: model, NumKvHeads: int32(tc.heads), CachePrefix: "pfx"}
			e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "tiny", Name: "v", Slots: 256,
				World: tc.world, TokensPerBlock: T, Format: tc.format, KeyParams: kp, SkipVerify: tc.shared})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close(ctx)
			reqs := prompts(21, 6, T, "cold")
			if _, err := e.Run(ctx, reqs, 3); err != nil {
				t.Fatal(err)
			}
			warm := make([]enginesim.Request, len(reqs))
			for i, q := range reqs {
				warm[i] = enginesim.Request{ID: "warm-" + q.ID, Tokens: q.Tokens}
			}
			res, err := e.Run(ctx, warm, 3)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			for _, q := range reqs {
				want += (len(q.Tokens) - 1) / T * T
			}
			if res.MatchedTokens != want {
				t.Errorf("warm pass matched %d tokens, want every full block but the last token's: %d (%+v)", res.MatchedTokens, want, res)
			}

			// Every key in the pool is one vLLM's connector names for these prompts, and
			// every block the prompts saved has its key rank's page.
			s, err := keys.LookupScheme(tc.format)
			if err != nil {
				t.Fatal(err)
			}
			seed := "0"
			named := map[string]bool{}
			for _, q := range reqs {
				p := keys.Params{TokensPerBlock: T, PythonHashSeed: &seed, Model: model, CachePrefix: "pfx", TPSize: tc.world, NumKVHeads: tc.heads}
				res, err := s.Derive(&p, q.Tokens, keys.KeySetLookup)
				if err != nil {
					t.Fatal(err)
				}
				for _, b := range res.Blocks {
					if len(b.Keys) != tc.keyRanks {
						t.Fatalf("block %d has %d lookup keys, want %d key ranks", b.Index, len(b.Keys), tc.keyRanks)
					}
					for _, k := range b.Keys {
						named[k] = true
					}
				}
			}
			got, err := emb.Keys(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 {
				t.Fatal("the pool holds no pages")
			}
			for _, k := range got {
				if !named[k] {
					t.Errorf("pool key %q is not one vLLM's connector names for these prompts", k)
				}
				if !strings.HasPrefix(k, "pfx@Tiny-Llama-1B@tp_rank:") {
					t.Errorf("pool key %q: want vLLM's layout", k)
				}
			}
			slices.Sort(got)
			t.Logf("%d pages, e.g. %s", len(got), got[0])
		})
	}
}

// A registration's key inputs are checked: vLLM formats need the seed and model, key_params
// belong to vLLM formats only, and a request's key inputs must be its rank's scheme's.
func TestVLLMRegistrationRefusals(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		format string
		kp     *enginepb.KeyParams
		msg    string
	}{
		{"no seed", "vllm", &enginepb.KeyParams{Model: "m"}, "PYTHONHASHSEED"},
		{"no key params", "vllm", nil, "PYTHONHASHSEED"},
		{"no model", "vllm", &enginepb.KeyParams{PythonHashSeed: proto.String("0")}, "--model"},
		{"key params with trtllm", "trtllm", &enginepb.KeyParams{Model: "m"}, "key_params are the inputs of vLLM's formats"},
		{"pipeline parallel", "vllm", &enginepb.KeyParams{PythonHashSeed: proto.String("0"), Model: "m", PpSize: 2}, "tensor-parallel"},
		{"lineage A", "vllm-lineage-a", &enginepb.KeyParams{PythonHashSeed: proto.String("0"), Model: "m"}, "vllm-lineage-a"},
		{"model with a space", "vllm", &enginepb.KeyParams{PythonHashSeed: proto.String("0"), Model: "a b"}, "key_params.model"},
		{"unknown format", "vllm2", nil, "vllm-xxhash"},
		{"extra keys", "vllm", &enginepb.KeyParams{PythonHashSeed: proto.String("0"), Model: "m", ExtraKeys: "bare"}, "want untagged"},
	} {
		_, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "bad", Slots: 8, TokensPerBlock: 16, Format: tc.format, KeyParams: tc.kp})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want InvalidArgument naming %q", tc.name, err, tc.msg)
		}
	}

	// A TensorRT-LLM rank refuses vLLM's request inputs, and a vLLM rank TensorRT-LLM's.
	for _, tc := range []struct {
		format string
		kp     *enginepb.KeyParams
		req    *enginepb.Request
		msg    string
	}{
		{"", nil, &enginepb.Request{Id: "a", Tokens: make([]int64, 40), LoraName: proto.String("x")}, "vLLM's LoRA name"},
		{"vllm", &enginepb.KeyParams{PythonHashSeed: proto.String("0"), Model: "m"}, &enginepb.Request{Id: "a", Tokens: make([]int64, 40), LoraTaskId: proto.Int64(3)}, "LoRA task id"},
		{"vllm", &enginepb.KeyParams{PythonHashSeed: proto.String("0"), Model: "m"}, &enginepb.Request{Id: "a", Tokens: make([]int64, 40),
			MmFeatures: []*enginepb.MMFeature{{Identifier: "b", Offset: 9, Length: 2}, {Identifier: "a", Offset: 1, Length: 2}}}, "sorted by offset"},
	} {
		name := "s" + tc.format
		e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: name, Slots: 8, TokensPerBlock: 16, Format: tc.format, KeyParams: tc.kp})
		if err != nil {
			t.Fatal(err)
		}
		c, err := engineapi.Dial(r.Info.Socket)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.AttachScheduler(ctx, &enginepb.AttachSchedulerRequest{Engine: name + "/rank0", SchedulerToken: e.SchedulerToken(0)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Lookup(ctx, &enginepb.LookupRequest{Engine: name + "/rank0", Request: tc.req})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("format %q: lookup %v, want InvalidArgument naming %q", tc.format, err, tc.msg)
		}
		c.Close()
		_ = e.Close(ctx)
	}
}
