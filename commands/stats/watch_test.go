package stats

import (
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
)

// TestDurationFlags pins one rule for durations: --watch and --timeout take a Go duration or a
// number of seconds, as every other duration flag and config key does.
func TestDurationFlags(t *testing.T) {
	tests := []struct {
		args    string
		watch   int
		timeout time.Duration
		wantErr string
	}{
		{args: "--pool a:1 --watch 5s --timeout 0.5", watch: 5, timeout: 500 * time.Millisecond},
		{args: "--pool a:1 --watch 1m --timeout 2", watch: 60, timeout: 2 * time.Second},
		{args: "--pool a:1 --watch 3", watch: 3, timeout: 5 * time.Second},
		{args: "--pool a:1 --watch 1.5s", wantErr: "whole seconds"},
		{args: "--pool a:1 --watch soon", wantErr: "not a duration"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			var got *Options
			cmd := NewCmdStats(cmdtest.Factory(), func(o *Options) error { got = o; return nil })
			err := cmdtest.Execute(t, cmd, tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Watch != tt.watch || got.Timeout != tt.timeout {
				t.Errorf("watch %d timeout %v, want %d %v", got.Watch, got.Timeout, tt.watch, tt.timeout)
			}
		})
	}
}
