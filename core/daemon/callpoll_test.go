package daemon

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// TestCallPollWindow: a negative setting turns polling off, a positive one is taken as is, and
// zero picks DefaultCallChannelPoll only where there are CPUs to spare.
func TestCallPollWindow(t *testing.T) {
	if w := callPollWindow(-1); w != 0 {
		t.Errorf("negative: %v, want no polling", w)
	}
	if w := callPollWindow(3 * time.Millisecond); w != 3*time.Millisecond {
		t.Errorf("3ms: %v", w)
	}
	want := time.Duration(0)
	if runtime.GOMAXPROCS(0) >= callPollMinCPUs {
		want = DefaultCallChannelPoll
	}
	if w := callPollWindow(0); w != want {
		t.Errorf("default with GOMAXPROCS %d: %v, want %v", runtime.GOMAXPROCS(0), w, want)
	}
}

// TestCallPollingBounded: a reader polls for the window after the last request or reply, and
// while a call runs for at most callPollBusyFactor windows from its start; never once the
// channel is closed.
func TestCallPollingBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &callChannel{ctx: ctx, poll: 20 * time.Millisecond}
	now := callPollNow()
	c.active.Store(now)
	if !c.polling() {
		t.Fatal("not polling right after a request")
	}
	c.active.Store(now - int64(c.poll) - 1)
	if c.polling() {
		t.Fatal("polling a window after the last request, with no call running")
	}
	c.callStart.Store(now - int64(c.poll))
	if !c.polling() {
		t.Fatal("not polling while a call runs")
	}
	c.callStart.Store(now - callPollBusyFactor*int64(c.poll) - 1)
	if c.polling() {
		t.Fatal("polling after a call ran for callPollBusyFactor windows")
	}
	c.active.Store(callPollNow())
	cancel()
	if c.polling() {
		t.Fatal("polling on a closed channel")
	}
}
