package stats

import (
	"runtime"
	"testing"
	"time"
)

// spinSink keeps spin's work observable.
var spinSink uint64

// spin burns CPU on the calling thread for about d.
func spin(d time.Duration) {
	x := uint64(1)
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := range 10000 {
			x += uint64(i) * x
		}
	}
	spinSink += x
}

// A sample without ThreadCPU times phases by wall clock alone and never reads the thread's CPU
// clock, so its goroutine need not be pinned to a thread; with ThreadCPU it also counts the
// thread's CPU time.
func TestLoadSampleThreadCPU(t *testing.T) {
	wallOnly := &LoadSample{}
	m := wallOnly.Start()
	spin(20 * time.Millisecond)
	wallOnly.End(PhaseGet, m)
	if got := wallOnly.Phases[PhaseGet]; got.Wall < 20*time.Millisecond || got.CPU != 0 {
		t.Errorf("without ThreadCPU: %+v, want wall >= 20ms and no CPU", got)
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	withCPU := &LoadSample{ThreadCPU: true}
	m = withCPU.Start()
	spin(20 * time.Millisecond)
	withCPU.End(PhaseGet, m)
	if got := withCPU.Phases[PhaseGet]; got.Wall < 20*time.Millisecond || got.CPU <= 0 || got.CPU > got.Wall+10*time.Millisecond {
		t.Errorf("with ThreadCPU: %+v, want wall >= 20ms and some CPU, no more than the wall time", got)
	}
}
