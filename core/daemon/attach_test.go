package daemon_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
)

// A scheduler in another process than the rank's worker (vLLM's engine core) attaches with the
// registration's scheduler token and then sees the rank's pool through its scheduler calls;
// worker calls and Unregister stay with the registering connection.
func TestAttachScheduler(t *testing.T) {
	r := start(t, 64<<20)
	ctx := context.Background()
	const T = 16
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "v", Slots: 64, World: 2, TokensPerBlock: T})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	reqs := prompts(11, 3, T, "cold")
	if _, err := e.Run(ctx, reqs, 2); err != nil {
		t.Fatal(err)
	}
	token := e.SchedulerToken(0)
	if len(token) != 64 {
		t.Fatalf("scheduler token %q: want 64 hex characters", token)
	}
	if got := e.SchedulerToken(1); got != "" {
		t.Errorf("rank 1 registered without the scheduler adapter but got token %q", got)
	}

	sched, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Close()
	prompt := reqs[0].Tokens
	lookup := func(id string) (*enginepb.LookupResponse, error) {
		return sched.Lookup(ctx, &enginepb.LookupRequest{Engine: "v/rank0", Request: &enginepb.Request{Id: id, Tokens: prompt}})
	}
	if _, err := lookup("before"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("lookup before attaching: %v, want PermissionDenied", err)
	}
	for _, tc := range []struct {
		name, engine, token string
		code                codes.Code
		msg                 string
	}{
		{"wrong token", "v/rank0", strings.Repeat("0", 64), codes.PermissionDenied, "wrong scheduler token"},
		{"no token", "v/rank0", "", codes.PermissionDenied, "wrong scheduler token"},
		{"rank 0's token on rank 1", "v/rank1", token, codes.FailedPrecondition, "without the scheduler adapter"},
		{"unknown engine", "nobody", token, codes.NotFound, "nobody"},
		{"no engine", "", token, codes.InvalidArgument, "no engine"},
		{"oversized token", "v/rank0", strings.Repeat("a", 257), codes.InvalidArgument, "too long"},
	} {
		_, err := sched.AttachScheduler(ctx, &enginepb.AttachSchedulerRequest{Engine: tc.engine, SchedulerToken: tc.token})
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %s naming %q", tc.name, err, tc.code, tc.msg)
		}
	}
	if _, err := e.Client(0).AttachScheduler(ctx, &enginepb.AttachSchedulerRequest{Engine: "v/rank0", SchedulerToken: token}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("the registering connection attaching to itself: %v", err)
	}

	resp, err := sched.AttachScheduler(ctx, &enginepb.AttachSchedulerRequest{Engine: "v/rank0", SchedulerToken: token})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	if resp.GetEngine() != "v/rank0" || resp.GetShard() == "" || len(resp.GetDeclarations()) == 0 {
		t.Errorf("attach response %v: want the engine, its shard and its declarations", resp)
	}
	got, err := lookup("attached")
	if err != nil {
		t.Fatalf("lookup after attaching: %v", err)
	}
	full := (len(prompt) - 1) / T * T
	if int(got.GetMatchedTokens()) != full {
		t.Errorf("the attached scheduler matched %d tokens of a saved prompt of %d, want %d", got.GetMatchedTokens(), len(prompt), full)
	}
	if _, err := sched.RequestFinished(ctx, &enginepb.RequestRef{Engine: "v/rank0", RequestId: "attached"}); err != nil {
		t.Errorf("request finished from the attached scheduler: %v", err)
	}
	if _, err := sched.TakeSubmittedSaves(ctx, &enginepb.EngineRef{Engine: "v/rank0"}); err != nil {
		t.Errorf("take submitted saves from the attached scheduler: %v", err)
	}
	// Worker calls and Unregister remain the registering connection's.
	for name, call := range map[string]func() error{
		"bind meta": func() error {
			_, err := sched.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "v/rank0", Metadata: &enginepb.Metadata{}})
			return err
		},
		"start load": func() error { _, err := sched.StartLoad(ctx, &enginepb.EngineRef{Engine: "v/rank0"}); return err },
		"unregister": func() error { _, err := sched.Unregister(ctx, &enginepb.EngineRef{Engine: "v/rank0"}); return err },
		"rank 1":     func() error { _, err := sched.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "v/rank1"}); return err },
	} {
		if err := call(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s from the attached scheduler: %v, want PermissionDenied", name, err)
		}
	}
	// The engine keeps running with a scheduler attached elsewhere.
	if res, err := e.Run(ctx, renamed(reqs, "warm"), 2); err != nil || res.LoadedBlocks == 0 {
		t.Errorf("warm run with a scheduler attached: %+v, %v", res, err)
	}

	// The attachment ends with the attached connection.
	sched.Close()
	again, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, err := again.Lookup(ctx, &enginepb.LookupRequest{Engine: "v/rank0", Request: &enginepb.Request{Id: "x", Tokens: prompt}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a new connection without attaching: %v", err)
	}
	// And with the registration.
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := again.AttachScheduler(ctx, &enginepb.AttachSchedulerRequest{Engine: "v/rank0", SchedulerToken: token}); status.Code(err) != codes.NotFound {
		t.Errorf("attach after the rank unregistered: %v", err)
	}
}
