package serve

import (
	"context"
	"testing"

	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
)

// --disagg-config is a flag name users type and scripts hold: pinned here.
func TestDisaggConfigFlag(t *testing.T) {
	var got *Options
	cmd := NewCmdServe(cmdtest.Factory(), func(_ context.Context, o *Options) error { got = o; return nil })
	if err := cmdtest.Execute(t, cmd, "--disagg-config /etc/trtllm/disagg_config.yaml"); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.DisaggConfig != "/etc/trtllm/disagg_config.yaml" {
		t.Fatalf("options %+v", got)
	}
	if FlagDisaggConfig != "disagg-config" {
		t.Fatalf("flag renamed to %q", FlagDisaggConfig)
	}
}
