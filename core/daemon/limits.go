package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// Limits bounds what one registration and one request may ask of the daemon, so that no field
// an engine controls can make it allocate without bound, start threads without bound or write
// keys the pool refuses. A request over a limit is refused with InvalidArgument naming the limit
// (see docs/SECURITY.md for the table). Zero fields take DefaultLimits' values.
type Limits struct {
	// MaxEngines is the most engine ranks registered at once.
	MaxEngines int
	// MaxEngineNameBytes bounds the engine name.
	MaxEngineNameBytes int
	// MaxModelKeyBytes and MaxNamespaceBytes bound the key components an engine names; both
	// must be printable ASCII without spaces.
	MaxModelKeyBytes  int
	MaxNamespaceBytes int
	// MaxWorldSize bounds world_size (rank must be below it).
	MaxWorldSize int
	// MaxLayerGroups bounds the layout's layer groups.
	MaxLayerGroups int
	// MaxRegionsPerGroup bounds the regions (sharded plus replicated) of one layer group.
	MaxRegionsPerGroup int
	// MaxSlotsPerGroup bounds the page slots of one layer group.
	MaxSlotsPerGroup int
	// MaxKeysPerBlock bounds the pool keys one block needs (groups × (attention world + 1)).
	MaxKeysPerBlock int
	// MaxPageBytes bounds one page (the sum of a group's region sizes).
	MaxPageBytes uint64
	// MaxTokensPerBlock bounds tokens_per_block.
	MaxTokensPerBlock int
	// MaxPromptLookahead bounds prompt_lookahead.
	MaxPromptLookahead int
	// MaxAsyncLoadWorkers bounds async_load_workers (each is a goroutine with staging).
	MaxAsyncLoadWorkers int
	// MaxTransferBatchSize bounds transfer_batch_size.
	MaxTransferBatchSize int
	// MaxTokensPerRequest bounds the tokens of one request in Lookup and BuildMeta.
	MaxTokensPerRequest int
	// MaxKeysPerLookup bounds the pool keys one Lookup asks about (blocks × keys per block).
	MaxKeysPerLookup int
	// MaxRequestIDBytes bounds a request id.
	MaxRequestIDBytes int
	// MaxStagingBufferBytes bounds staging_buffer_bytes, the host staging an engine rank may
	// ask for per direction.
	MaxStagingBufferBytes uint64
	// MaxLiveRequests bounds the requests one scheduler rank tracks at once (looked up and not
	// yet finished or reset).
	MaxLiveRequests int
	// MaxTrackedTokens bounds the tokens one scheduler rank holds over all its live requests.
	MaxTrackedTokens int
	// MaxPromptArenaBytes bounds the prompt arena one engine rank may register (mapped
	// read-only for as long as the rank is registered).
	MaxPromptArenaBytes uint64
	// MaxCallChannelsPerConn bounds the call channels (OpenCallChannel) one engine connection
	// may have open at once; each holds a descriptor and two goroutines.
	MaxCallChannelsPerConn int
	// MaxCallRequestBytes bounds one request message on a call channel (all its frames); a
	// larger one is refused with ResourceExhausted and the channel stays usable. At most
	// engineapi.MaxMessageBytes.
	MaxCallRequestBytes int
}

// DefaultLimits returns the limits kvctl serve runs with.
func DefaultLimits() Limits {
	return Limits{
		MaxEngines:           1024,
		MaxEngineNameBytes:   256,
		MaxModelKeyBytes:     256,
		MaxNamespaceBytes:    128,
		MaxWorldSize:         256,
		MaxLayerGroups:       64,
		MaxRegionsPerGroup:   4096,
		MaxSlotsPerGroup:     1 << 24,
		MaxKeysPerBlock:      1024,
		MaxPageBytes:         1 << 30,
		MaxTokensPerBlock:    1 << 16,
		MaxPromptLookahead:   1 << 16,
		MaxAsyncLoadWorkers:  64,
		MaxTransferBatchSize: 1 << 16,
		MaxTokensPerRequest:  1 << 21,
		MaxKeysPerLookup:     1 << 21,
		MaxRequestIDBytes:    1024,
		// The flag's own ceiling is 1 GiB; an engine may ask for up to 4 GiB.
		MaxStagingBufferBytes: 4 << 30,
		MaxLiveRequests:       1 << 16,
		MaxTrackedTokens:      1 << 27,
		MaxPromptArenaBytes:   engineapi.DefaultMaxPromptArenaBytes,
		// An engine opens one channel per thread that makes calls.
		MaxCallChannelsPerConn: 16,
		// A 32k-token prompt is 256 KiB packed; a larger request goes over gRPC.
		MaxCallRequestBytes: 4 << 20,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	set := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	set(&l.MaxEngines, d.MaxEngines)
	set(&l.MaxEngineNameBytes, d.MaxEngineNameBytes)
	set(&l.MaxModelKeyBytes, d.MaxModelKeyBytes)
	set(&l.MaxNamespaceBytes, d.MaxNamespaceBytes)
	set(&l.MaxWorldSize, d.MaxWorldSize)
	set(&l.MaxLayerGroups, d.MaxLayerGroups)
	set(&l.MaxRegionsPerGroup, d.MaxRegionsPerGroup)
	set(&l.MaxSlotsPerGroup, d.MaxSlotsPerGroup)
	set(&l.MaxKeysPerBlock, d.MaxKeysPerBlock)
	set(&l.MaxTokensPerBlock, d.MaxTokensPerBlock)
	set(&l.MaxPromptLookahead, d.MaxPromptLookahead)
	set(&l.MaxAsyncLoadWorkers, d.MaxAsyncLoadWorkers)
	set(&l.MaxTransferBatchSize, d.MaxTransferBatchSize)
	set(&l.MaxTokensPerRequest, d.MaxTokensPerRequest)
	set(&l.MaxKeysPerLookup, d.MaxKeysPerLookup)
	set(&l.MaxRequestIDBytes, d.MaxRequestIDBytes)
	set(&l.MaxLiveRequests, d.MaxLiveRequests)
	set(&l.MaxTrackedTokens, d.MaxTrackedTokens)
	set(&l.MaxCallChannelsPerConn, d.MaxCallChannelsPerConn)
	set(&l.MaxCallRequestBytes, d.MaxCallRequestBytes)
	if l.MaxPageBytes == 0 {
		l.MaxPageBytes = d.MaxPageBytes
	}
	if l.MaxStagingBufferBytes == 0 {
		l.MaxStagingBufferBytes = d.MaxStagingBufferBytes
	}
	if l.MaxPromptArenaBytes == 0 {
		l.MaxPromptArenaBytes = d.MaxPromptArenaBytes
	}
	return l
}

func (l Limits) validate() error {
	for name, v := range map[string]int{
		"max engines": l.MaxEngines, "max engine name bytes": l.MaxEngineNameBytes, "max model key bytes": l.MaxModelKeyBytes,
		"max namespace bytes": l.MaxNamespaceBytes, "max world size": l.MaxWorldSize, "max layer groups": l.MaxLayerGroups,
		"max regions per group": l.MaxRegionsPerGroup, "max slots per group": l.MaxSlotsPerGroup, "max keys per block": l.MaxKeysPerBlock,
		"max tokens per block": l.MaxTokensPerBlock, "max prompt lookahead": l.MaxPromptLookahead, "max async load workers": l.MaxAsyncLoadWorkers,
		"max transfer batch size": l.MaxTransferBatchSize, "max tokens per request": l.MaxTokensPerRequest,
		"max keys per lookup": l.MaxKeysPerLookup, "max request id bytes": l.MaxRequestIDBytes,
		"max call channels per connection": l.MaxCallChannelsPerConn, "max call request bytes": l.MaxCallRequestBytes,
	} {
		if v < 0 {
			return fmt.Errorf("limits: %s is negative (%d)", name, v)
		}
	}
	if l.MaxCallRequestBytes > engineapi.MaxMessageBytes {
		return fmt.Errorf("limits: max call request bytes %d is above the engine API's message limit of %d", l.MaxCallRequestBytes, engineapi.MaxMessageBytes)
	}
	return nil
}

// limitError is a request over one of the Limits: InvalidArgument naming the field, the value
// and the limit.
func limitError(call, field string, got any, limit any) error {
	return status.Errorf(codes.InvalidArgument, "%s: %s %v is above the limit of %v", call, field, got, limit)
}

// checkKeyComponent refuses a key component with characters that are not printable ASCII or that
// is longer than limit bytes.
func checkKeyComponent(field, s string, limit int) error {
	if len(s) > limit {
		return fmt.Errorf("%s is %d bytes, above the limit of %d", field, len(s), limit)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%s has byte 0x%02x at %d: only printable ASCII without spaces is allowed", field, c, i)
		}
	}
	return nil
}

// checkRegister refuses a registration over the limits before anything is allocated for it.
func (l Limits) checkRegister(req *enginepb.RegisterRequest) error {
	const call = "register"
	inv := func(err error) error { return status.Errorf(codes.InvalidArgument, "%s: %v", call, err) }
	if n := len(req.GetEngine()); n > l.MaxEngineNameBytes {
		return limitError(call, "engine name length", n, l.MaxEngineNameBytes)
	}
	for i, c := range []byte(req.GetEngine()) {
		if c < ' ' || c == 0x7f {
			return inv(fmt.Errorf("engine name has control byte 0x%02x at %d", c, i))
		}
	}
	if err := checkKeyComponent("model_key", req.GetModelKey(), l.MaxModelKeyBytes); err != nil {
		return inv(err)
	}
	if err := checkKeyComponent("namespace", req.GetNamespace(), l.MaxNamespaceBytes); err != nil {
		return inv(err)
	}
	if err := checkNamespaceSeparator(req.GetNamespace()); err != nil {
		return inv(err)
	}
	if kp := req.GetKeyParams(); kp != nil {
		for _, f := range []struct{ name, v string }{
			{"key_params.model", kp.GetModel()}, {"key_params.cache_prefix", kp.GetCachePrefix()},
			{"key_params.store_namespace", kp.GetStoreNamespace()}, {"key_params.python_hash_seed", kp.GetPythonHashSeed()},
		} {
			if err := checkKeyComponent(f.name, f.v, l.MaxModelKeyBytes); err != nil {
				return inv(err)
			}
		}
	}
	if w := req.GetWorldSize(); w < 0 || int(w) > l.MaxWorldSize {
		if w < 0 {
			return inv(fmt.Errorf("world_size %d is negative", w))
		}
		return limitError(call, "world_size", w, l.MaxWorldSize)
	}
	if r := req.GetRank(); r < 0 {
		return inv(fmt.Errorf("rank %d is negative", r))
	}
	if v := req.GetPromptLookahead(); v < 0 || int(v) > l.MaxPromptLookahead {
		if v < 0 {
			return inv(fmt.Errorf("prompt_lookahead %d is negative", v))
		}
		return limitError(call, "prompt_lookahead", v, l.MaxPromptLookahead)
	}
	if v := req.GetAsyncLoadWorkers(); v < 0 || int(v) > l.MaxAsyncLoadWorkers {
		if v < 0 {
			return inv(fmt.Errorf("async_load_workers %d is negative", v))
		}
		return limitError(call, "async_load_workers", v, l.MaxAsyncLoadWorkers)
	}
	if v := req.GetTransferBatchSize(); v < 0 || int(v) > l.MaxTransferBatchSize {
		if v < 0 {
			return inv(fmt.Errorf("transfer_batch_size %d is negative", v))
		}
		return limitError(call, "transfer_batch_size", v, l.MaxTransferBatchSize)
	}
	if v := req.GetStagingBufferBytes(); v > l.MaxStagingBufferBytes {
		return limitError(call, "staging_buffer_bytes", v, l.MaxStagingBufferBytes)
	}
	lay := req.GetLayout()
	if lay == nil {
		return nil // engineapi.LayoutFromPB names the problem
	}
	if v := lay.GetTokensPerBlock(); int(v) > l.MaxTokensPerBlock {
		return limitError(call, "tokens_per_block", v, l.MaxTokensPerBlock)
	}
	groups := lay.GetGroups()
	if len(groups) > l.MaxLayerGroups {
		return limitError(call, "layer groups", len(groups), l.MaxLayerGroups)
	}
	world := max(int(req.GetWorldSize()), 1)
	if req.GetAttentionDp() {
		world = 1
	}
	if kpb := len(groups) * (world + 1); kpb > l.MaxKeysPerBlock {
		return limitError(call, fmt.Sprintf("keys per block (%d layer groups × (world %d + 1))", len(groups), world), kpb, l.MaxKeysPerBlock)
	}
	for i, g := range groups {
		if n := len(g.GetRegions()) + len(g.GetReplicatedRegions()); n > l.MaxRegionsPerGroup {
			return limitError(call, fmt.Sprintf("regions of layer group %d", i), n, l.MaxRegionsPerGroup)
		}
		if s := g.GetSlots(); s < 0 || int64(s) > int64(l.MaxSlotsPerGroup) {
			if s < 0 {
				return inv(fmt.Errorf("layer group %d has %d slots", i, s))
			}
			return limitError(call, fmt.Sprintf("slots of layer group %d", i), s, l.MaxSlotsPerGroup)
		}
		for _, set := range [][]*enginepb.Region{g.GetRegions(), g.GetReplicatedRegions()} {
			var page uint64
			for _, r := range set {
				// Saturate rather than wrap: the sum is only compared with the limit.
				page = min(page+min(r.GetSize(), 1<<62), 1<<62)
			}
			if page > l.MaxPageBytes {
				return limitError(call, fmt.Sprintf("page bytes of layer group %d", i), page, l.MaxPageBytes)
			}
		}
	}
	return nil
}

// checkRequest refuses a request over the limits: its id and its tokens, and for a Lookup the
// pool keys it would ask about.
func (l Limits) checkRequest(call string, id string, tokens int, tokensPerBlock, keysPerBlock int) error {
	if len(id) > l.MaxRequestIDBytes {
		return limitError(call, "request id length", len(id), l.MaxRequestIDBytes)
	}
	if tokens > l.MaxTokensPerRequest {
		return limitError(call, fmt.Sprintf("request %.64q tokens", id), tokens, l.MaxTokensPerRequest)
	}
	if tokensPerBlock > 0 && keysPerBlock > 0 {
		if k := (tokens / tokensPerBlock) * keysPerBlock; k > l.MaxKeysPerLookup {
			return limitError(call, fmt.Sprintf("pool keys of request %.64q (%d blocks × %d keys)", id, tokens/tokensPerBlock, keysPerBlock), k, l.MaxKeysPerLookup)
		}
	}
	return nil
}

// errTooManyEngines is returned when MaxEngines ranks are registered.
var errTooManyEngines = errors.New("too many engines registered")

// checkLookup applies the request limits to a Lookup of engine name.
func (d *Daemon) checkLookup(ctx context.Context, name string, r connector.Request) error {
	e, err := d.lookupEngine(ctx, name)
	if err != nil {
		return err
	}
	world := e.deploy.world
	if world < 1 {
		world = 1
	}
	if err := d.sec.limits.checkRequest("lookup", r.ID, len(r.Tokens), e.layout.TokensPerBlock, len(e.layout.Groups)*(world+1)); err != nil {
		return err
	}
	if err := d.sec.limits.checkTracked("lookup", e, r.ID, len(r.Tokens), true); err != nil {
		return err
	}
	return d.checkBudget("lookup", e, r.ID, len(r.Tokens))
}

// checkTracked refuses a call that would make the engine's scheduler hold more requests or
// tokens than the limits: a request it does not track yet (when count is set), or tokens past
// the total.
func (l Limits) checkTracked(call string, e *engine, id string, newTokens int, count bool) error {
	if e.scheduler == nil {
		return nil
	}
	reqs, toks := e.scheduler.Tracked()
	if count && reqs >= l.MaxLiveRequests && !e.scheduler.Tracks(id) {
		return status.Errorf(codes.ResourceExhausted, "%s: engine %q tracks %d live requests, the limit; finish or reset some first", call, e.name, reqs)
	}
	if toks+newTokens > l.MaxTrackedTokens {
		return status.Errorf(codes.ResourceExhausted, "%s: engine %q would hold %d tokens over its live requests, above the limit of %d; finish or reset some first", call, e.name, toks+newTokens, l.MaxTrackedTokens)
	}
	return nil
}

// checkBuildMeta applies the request limits to every request of a BuildMeta.
func (d *Daemon) checkBuildMeta(req *enginepb.BuildMetaRequest) error {
	for _, set := range [][]*enginepb.RequestData{req.GetNewRequests(), req.GetCachedRequests()} {
		for _, r := range set {
			if err := d.sec.limits.checkRequest("build meta", r.GetId(), len(r.GetNewTokens()), 0, 0); err != nil {
				return err
			}
		}
	}
	for _, id := range req.GetSubmittedSaves() {
		if len(id) > d.sec.limits.MaxRequestIDBytes {
			return limitError("build meta", "submitted save id length", len(id), d.sec.limits.MaxRequestIDBytes)
		}
	}
	return nil
}

// checkNamespaceSeparator refuses a namespace holding '/'. Keys are written exactly as
// TensorRT-LLM writes them, {namespace}/{model_key}/..., so with a '/' in the namespace two
// different (namespace, model key) pairs can write the same keys: namespace "ns/x" with model
// "m" and namespace "ns" with model "x/m" would share every page. Model keys may hold '/' (model
// names do): once the namespace has none, its end is the first '/' of a key and the pair is read
// off a key unambiguously, so refusing it here keeps tenants apart without changing a key byte.
func checkNamespaceSeparator(ns string) error {
	if i := strings.IndexByte(ns, '/'); i >= 0 {
		return fmt.Errorf("namespace %q has '/' at byte %d: keys are {namespace}/{model_key}/..., so a '/' in the namespace lets another namespace and model key write the same keys; use a namespace without '/'", ns, i)
	}
	return nil
}
