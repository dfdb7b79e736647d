package daemon_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
)

// TestPackedTokensLookup runs lookups over a real daemon's socket: the packed and the repeated
// token fields give the same answer for the same prompt, warm and cold; malformed packed fields
// (a length that is not a multiple of 8, more tokens than the bound, both fields set) are
// refused with InvalidArgument naming the problem; and the daemon keeps serving afterwards.
func TestPackedTokensLookup(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	const T = 16
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "pk", TokensPerBlock: T, Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	reqs := prompts(21, 3, T, "fill")
	if _, err := e.Run(ctx, reqs, 0); err != nil {
		t.Fatal(err)
	}
	// The engine's own connection: only the connection that registered an engine may call it.
	c := e.Client(0)
	lookup := func(id string, req *enginepb.Request) (int, error) {
		req.Id, req.ContextOnly = id, true
		resp, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "pk/rank0", Request: req})
		if err == nil {
			if _, err := c.RequestReset(ctx, &enginepb.RequestRef{Engine: "pk/rank0", RequestId: id}); err != nil {
				t.Fatal(err)
			}
		}
		return int(resp.GetMatchedTokens()), err
	}
	cold := prompts(99, 1, T, "cold")[0].Tokens
	for i, toks := range [][]int64{reqs[0].Tokens, reqs[2].Tokens, cold} {
		wantMatch := (len(toks) - 1) / T * T
		if i == 2 {
			wantMatch = 0
		}
		rep, err := lookup("rep", &enginepb.Request{Tokens: toks})
		if err != nil {
			t.Fatal(err)
		}
		packed, err := lookup("packed", &enginepb.Request{TokensPacked: engineapi.PackTokens(nil, toks)})
		if err != nil {
			t.Fatal(err)
		}
		if rep != wantMatch || packed != wantMatch {
			t.Errorf("prompt %d (%d tokens): matched %d repeated, %d packed; want %d", i, len(toks), rep, packed, wantMatch)
		}
		// The packed field through AdmissionQuery too.
		aq, err := c.AdmissionQuery(ctx, &enginepb.LookupRequest{Engine: "pk/rank0", Request: &enginepb.Request{Id: "aq", TokensPacked: engineapi.PackTokens(nil, toks), ContextOnly: true}})
		if err != nil || int(aq.GetMatchedTokens()) != wantMatch {
			t.Errorf("prompt %d admission query: %d, %v; want %d", i, aq.GetMatchedTokens(), err, wantMatch)
		}
		_, _ = c.RequestReset(ctx, &enginepb.RequestRef{Engine: "pk/rank0", RequestId: "aq"})
	}

	// num_computed_tokens is checked against the packed prompt's length: a block-aligned count
	// inside it is looked up from there, one past its end is refused.
	toks := reqs[0].Tokens
	resp, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "pk/rank0", NumComputedTokens: T,
		Request: &enginepb.Request{Id: "part", TokensPacked: engineapi.TokensView(toks), ContextOnly: true}})
	if err != nil || int(resp.GetMatchedTokens()) != (len(toks)-1)/T*T-T {
		t.Errorf("packed lookup from token %d: matched %d, %v; want %d", T, resp.GetMatchedTokens(), err, (len(toks)-1)/T*T-T)
	}
	_, _ = c.RequestReset(ctx, &enginepb.RequestRef{Engine: "pk/rank0", RequestId: "part"})
	_, err = c.Lookup(ctx, &enginepb.LookupRequest{Engine: "pk/rank0", NumComputedTokens: int32(len(toks) + 1),
		Request: &enginepb.Request{Id: "past", TokensPacked: engineapi.TokensView(toks), ContextOnly: true}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "past the prompt") {
		t.Errorf("num_computed_tokens past the packed prompt: %v", err)
	}

	good := engineapi.PackTokens(nil, reqs[0].Tokens)
	for _, tc := range []struct {
		name string
		req  *enginepb.Request
		msg  string
	}{
		{"seven bytes", &enginepb.Request{TokensPacked: good[:7]}, "tokens_packed has 7 bytes, not a multiple of 8"},
		{"one byte short", &enginepb.Request{TokensPacked: good[:len(good)-1]}, "not a multiple of 8"},
		{"over the bound", &enginepb.Request{TokensPacked: make([]byte, (engineapi.MaxRequestTokens+1)*engineapi.TokenBytes)}, "more than the 4194304 allowed"},
		{"both fields", &enginepb.Request{Tokens: reqs[0].Tokens, TokensPacked: good}, "both tokens"},
	} {
		_, err := lookup("bad", tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want InvalidArgument naming %q", tc.name, err, tc.msg)
		}
	}
	// Still serving, and the refused requests left nothing behind: the engine runs its prompts
	// again and loads every offerable block.
	warmRun(ctx, t, e, reqs, "-again", "second run")
}

// TestPlainGRPCClient checks that an engine using stock gRPC (default codec, windows and buffer
// pool, as grpcio and other languages' clients do) still talks to the daemon, whose engine
// socket runs its own codec and transport settings: it registers nothing, so a lookup is
// answered NotFound after the daemon has decoded the packed prompt.
func TestPlainGRPCClient(t *testing.T) {
	r := start(t, 16<<20)
	conn, err := grpc.NewClient("unix://"+r.Info.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := enginepb.NewEngineClient(conn)
	toks := make([]int64, 32<<10)
	for i := range toks {
		toks[i] = int64(i)
	}
	for _, req := range []*enginepb.Request{{Id: "a", TokensPacked: engineapi.PackTokens(nil, toks)}, {Id: "b", Tokens: toks}} {
		_, err = c.Lookup(context.Background(), &enginepb.LookupRequest{Engine: "nobody", Request: req})
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "nobody") {
			t.Errorf("lookup %s from a stock gRPC client: %v, want NotFound naming the engine", req.GetId(), err)
		}
	}
	_, err = c.Lookup(context.Background(), &enginepb.LookupRequest{Engine: "nobody", Request: &enginepb.Request{Id: "c", TokensPacked: []byte{1, 2, 3}}})
	if status.Code(err) != codes.NotFound && status.Code(err) != codes.InvalidArgument {
		t.Errorf("malformed packed tokens from a stock client: %v", err)
	}
}
