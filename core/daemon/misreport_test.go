package daemon_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/pool/embedded"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Seed commit 4: misreported request ids are fail-stop. Over the real engine API, an engine
// that names a request against the protocol gets FailedPrecondition naming the request, the
// daemon logs the reason once, that engine's later calls fail the same way, and another
// engine on the same daemon goes on.
func TestMisreportedRequestIDsFailStopTheEngine(t *testing.T) {
	var logs syncBuffer
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "test", Capacity: 64 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Defaults: connector.Options{StagingBufferBytes: 8 << 20},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// The calls go over the engine's own connection: the registration belongs to it.
	cases := []struct {
		name string
		call func(c *engineapi.Client, engine string) error
		want string
	}{
		{"async id never queued", func(c *engineapi.Client, engine string) error {
			_, err := c.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: engine, StartedLoading: []string{"ghost"}})
			return err
		}, `"ghost" as loading asynchronously, but no asynchronous load was queued`},
		{"sync id outside the batch", func(c *engineapi.Client, engine string) error {
			_, err := c.DropBoundSaves(ctx, &enginepb.DropRequest{Engine: engine, RequestIds: []string{"stranger"}})
			return err
		}, `"stranger", which is not in the bound pass`},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := []string{"bad-a", "bad-b"}[i]
			e, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: name, Slots: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close(ctx)
			engine := name + "/rank0"
			own := e.Client(0)
			err = tc.call(own, engine)
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "misreported request id") {
				t.Fatalf("misreported call = %v, want FailedPrecondition containing %q", err, tc.want)
			}
			// Fail-stop: the engine's later calls fail with the same reason.
			_, err = own.StartLoad(ctx, &enginepb.EngineRef{Engine: engine})
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("a later StartLoad = %v, want the kept error", err)
			}
			// From another connection the engine cannot even be named.
			if _, err := c.StartLoad(ctx, &enginepb.EngineRef{Engine: engine}); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("StartLoad from another connection = %v, want PermissionDenied", err)
			}
			if got := strings.Count(logs.String(), "engine broke the connector protocol"); got != i+1 {
				t.Fatalf("%d protocol lines logged, want %d:\n%s", got, i+1, logs.String())
			}
			if !strings.Contains(logs.String(), "engine="+engine) {
				t.Fatalf("the logged reason does not name the engine:\n%s", logs.String())
			}
		})
	}
	// Another engine on the same daemon is untouched.
	good, err := enginesim.Start(ctx, enginesim.Config{Socket: r.Info.Socket, ModelKey: "m", Name: "good", Slots: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close(ctx)
	if _, err := good.Run(ctx, prompts(9, 6, 16, "good"), 2); err != nil {
		t.Fatalf("a well-behaved engine failed next to a stopped one: %v", err)
	}
}
