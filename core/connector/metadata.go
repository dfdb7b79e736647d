package connector

import (
	"errors"

	"github.com/kvctl/kvctl/core/keys"
)

// Request is what the engine tells the scheduler adapter about a request when it asks for a
// prefix.
type Request struct {
	ID string
	// Tokens is the request's token list so far (beam 0), prompt first.
	Tokens []int64
	// TokensOwned hands Tokens over to the scheduler with the call: it may keep the slice
	// instead of copying it, and the caller must not use or change it afterwards. Otherwise
	// the scheduler keeps a copy and Tokens stays the caller's.
	TokensOwned bool
	// Scope is the request's reuse scope: its cache salt under every scheme; its LoRA task id
	// and multimodal digests under TensorRT-LLM's.
	Scope keys.Scope
	// LoRAName, LoRAPath and MMFeatures are a vLLM request's LoRA adapter name and path and
	// its multimodal items (sorted by offset), for a rank with Options.VLLM.
	LoRAName   *string
	LoRAPath   *string
	MMFeatures []keys.MMFeature
	// HasMultimodal is set when the request has multimodal positions or lengths. Without
	// digests in Scope such a request is bypassed: never looked up, never saved.
	HasMultimodal bool
	// Dummy marks a padding request; it never reaches the connector.
	Dummy bool
	// ContextOnly marks the context leg of a disaggregated request.
	ContextOnly bool
}

// RequestData is one scheduled request in a scheduler output.
type RequestData struct {
	ID string
	// NewTokens are the tokens appended since the connector last saw the request (by its lookup
	// or an earlier RequestData); a prompt given to the lookup is not repeated.
	NewTokens []int64
	// NewBlockIDsByGroup holds, per layer group, the page indices appended to the request since
	// the previous RequestData, by block ordinal; -1 where a block has no page.
	NewBlockIDsByGroup [][]int
	// ComputedPosition is the number of tokens already computed before this pass, without a
	// prefix restore honoured in this pass.
	ComputedPosition int
	// NumScheduledTokens is the number of tokens this pass computes.
	NumScheduledTokens int
	// Dummy marks a padding request; it is skipped.
	Dummy bool
}

// SchedulerOutput is one pass's scheduled requests.
type SchedulerOutput struct {
	NewRequests    []RequestData
	CachedRequests []RequestData
	// SubmittedSaves is the worker's save-confirmation report (Worker.TakeSubmittedSaves) taken
	// just before this build: the requests whose saves a WaitForSave queued. On a tensor-parallel
	// server it is the scheduler rank's worker's report.
	SubmittedSaves []string
}

// PageTransfer names one block's page in one layer group: its hash and the engine page index.
// It carries no key: each worker derives its own keys from its namespace.
type PageTransfer struct {
	Hash  keys.PageHash
	Group int
	Page  int
}

// RequestTransfers is the pages one request moves in one direction.
type RequestTransfers struct {
	RequestID string
	Pages     []PageTransfer
}

// Metadata is what the scheduler adapter hands every worker of the engine for one pass.
type Metadata struct {
	// Loads are synchronous loads, made by StartLoad.
	Loads []RequestTransfers
	// Saves are made by WaitForSave.
	Saves []RequestTransfers
	// AsyncLoads are the transfers of requests parked this pass, queued by BindMeta.
	AsyncLoads []RequestTransfers
	// EarlyLoads name the requests of this pass whose synchronous load began at their
	// allocation report (Options.EarlyLoads); StartLoad waits for them as for Loads.
	EarlyLoads []string
}

// Errors callers branch on.
var (
	// ErrNotContextOnly refuses a request that is not context-only in speculative-prefill mode.
	ErrNotContextOnly = errors.New("speculative-prefill mode accepts only context-only requests")
	// ErrNoLayout is returned when pages are addressed before a layout was registered.
	ErrNoLayout = errors.New("no KV layout registered")
	// ErrLoadFailed is wrapped by the fatal error of a tensor-parallel rank that lost a page.
	ErrLoadFailed = errors.New("load failed")
	// ErrClosed is returned by calls after Close.
	ErrClosed = errors.New("connector closed")
	// ErrMisreportedRequest is wrapped by the fail-stop error for a request id an engine named
	// against the protocol: an asynchronous load announced for a request with no load queued or
	// whose load was already reported finished, or saves dropped for a request outside the
	// bound pass that was not handed back for a restart.
	ErrMisreportedRequest = errors.New("misreported request id")
	// ErrFailedLoadsNotTaken is wrapped by the fail-stop error for an engine that went on
	// without taking the requests a load failure handed back: an engine reading
	// reports_failed_loads must call TakeFailedLoadRequests after every StartLoad and
	// TakeFailedAsyncLoadRequests after every GetFinished.
	ErrFailedLoadsNotTaken = errors.New("failed loads not taken")
	// ErrCannotTransfer is wrapped by the error a worker keeps when bound metadata asks it for
	// a transfer its settings do not make: an asynchronous load on a worker without load
	// workers (registered without async_load while its scheduler rank offers asynchronously),
	// synchronous loads on a worker that makes none. Binding never fails; the next StartLoad
	// and GetFinished return the error.
	ErrCannotTransfer = errors.New("this rank's settings do not make the transfer")
)
