package stats

import (
	"sync"
	"time"
)

// Phase is one step of a prefix load.
type Phase int

// Load phases, in the order a load runs them.
const (
	PhaseResolve Phase = iota
	PhaseFence
	PhaseDescribe
	PhaseGet
	PhaseUnstage
	PhaseSync
	NumPhases
)

var phaseNames = [NumPhases]string{"resolve", "fence", "describe", "get", "unstage", "sync"}

// String returns the phase's name as it appears in log lines and metric labels.
func (p Phase) String() string {
	if p < 0 || p >= NumPhases {
		return "unknown"
	}
	return phaseNames[p]
}

// PhaseTime is the time spent in one phase: wall seconds and the CPU seconds of the thread
// that ran it.
type PhaseTime struct {
	Wall time.Duration
	CPU  time.Duration
}

// Mark is the start of a timed phase.
type Mark struct {
	wall time.Time
	cpu  time.Duration
}

// LoadSample is what one load did: one synchronous load pass or one request's asynchronous
// load. A nil *LoadSample records nothing and reads no clock, so callers time phases
// unconditionally and pass nil when stats are off.
type LoadSample struct {
	Phases      [NumPhases]PhaseTime
	Pages       int64         // pages asked of the pool
	StoreCalls  int64         // pool get calls
	LandedBytes int64         // bytes that reached engine memory
	Transfer    time.Duration // start of the load to its end
	FailedPages int64         // pages the pool could not serve
	Async       bool          // the sample is an asynchronous load
	Wait        time.Duration // asynchronous only: queued until a load worker took it
	// GPUCopy and GPUCheck are the device's own time on the load's pages checked on the GPU,
	// from CUDA events: from the first copy to the last copy done, and from then to the
	// check's digests back on the host. Zero where pages are checked on the host.
	GPUCopy, GPUCheck time.Duration
	// ThreadCPU also reads the thread's CPU clock at each phase boundary. It needs the goroutine
	// pinned to its OS thread (runtime.LockOSThread) for the whole sample, which costs a thread
	// hand-off every time the load blocks, so callers set it only when the stats line that
	// reports CPU per phase is on; without it the phases carry wall time alone.
	ThreadCPU bool
}

// Start begins timing a phase. With ThreadCPU the goroutine must stay on its OS thread until
// End for the CPU figure to be right (runtime.LockOSThread).
func (s *LoadSample) Start() Mark {
	if s == nil {
		return Mark{}
	}
	if !s.ThreadCPU {
		return Mark{wall: time.Now()}
	}
	return Mark{wall: time.Now(), cpu: threadCPU()}
}

// End adds the time since m to phase p.
func (s *LoadSample) End(p Phase, m Mark) {
	if s == nil || p < 0 || p >= NumPhases {
		return
	}
	s.Phases[p].Wall += time.Since(m.wall)
	if s.ThreadCPU {
		s.Phases[p].CPU += threadCPU() - m.cpu
	}
}

// LoadTotals is the sum of load samples over a period.
type LoadTotals struct {
	Loads       int64 // samples recorded (passes that moved pages, plus asynchronous loads)
	AsyncLoads  int64
	Phases      [NumPhases]PhaseTime
	Pages       int64
	StoreCalls  int64
	LandedBytes int64
	FailedPages int64
	TransferSum time.Duration
	TransferMax time.Duration
	WaitSum     time.Duration // asynchronous loads only
	WaitMax     time.Duration
	GPUCopySum  time.Duration // LoadSample.GPUCopy
	GPUCheckSum time.Duration // LoadSample.GPUCheck
}

// Add folds one sample in.
func (t *LoadTotals) Add(s *LoadSample) {
	t.Loads++
	if s.Async {
		t.AsyncLoads++
		t.WaitSum += s.Wait
		t.WaitMax = max(t.WaitMax, s.Wait)
	}
	for p := range s.Phases {
		t.Phases[p].Wall += s.Phases[p].Wall
		t.Phases[p].CPU += s.Phases[p].CPU
	}
	t.Pages += s.Pages
	t.StoreCalls += s.StoreCalls
	t.LandedBytes += s.LandedBytes
	t.FailedPages += s.FailedPages
	t.TransferSum += s.Transfer
	t.TransferMax = max(t.TransferMax, s.Transfer)
	t.GPUCopySum += s.GPUCopy
	t.GPUCheckSum += s.GPUCheck
}

// LoadStats accumulates load samples. It is safe for concurrent use: synchronous loads and
// every asynchronous load worker record into the same value.
type LoadStats struct {
	mu      sync.Mutex
	pending LoadTotals
	total   LoadTotals
	queued  int
	active  int
}

// Record folds s in. A nil sample is ignored.
func (l *LoadStats) Record(s *LoadSample) {
	if s == nil {
		return
	}
	l.mu.Lock()
	l.pending.Add(s)
	l.total.Add(s)
	l.mu.Unlock()
}

// SetQueue records the asynchronous loads waiting for a worker and those being loaded.
func (l *LoadStats) SetQueue(queued, active int) {
	l.mu.Lock()
	l.queued, l.active = queued, active
	l.mu.Unlock()
}

// Drain returns what was recorded since the previous Drain, resets it, and returns the current
// queue figures.
func (l *LoadStats) Drain() (t LoadTotals, queued, active int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, l.pending = l.pending, LoadTotals{}
	return t, l.queued, l.active
}

// Totals returns everything recorded since the value was made.
func (l *LoadStats) Totals() LoadTotals {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Merge adds the totals of o to t; maxima take the larger of the two.
func (t *LoadTotals) Merge(o LoadTotals) {
	t.Loads += o.Loads
	t.AsyncLoads += o.AsyncLoads
	for p := range t.Phases {
		t.Phases[p].Wall += o.Phases[p].Wall
		t.Phases[p].CPU += o.Phases[p].CPU
	}
	t.Pages += o.Pages
	t.StoreCalls += o.StoreCalls
	t.LandedBytes += o.LandedBytes
	t.FailedPages += o.FailedPages
	t.TransferSum += o.TransferSum
	t.TransferMax = max(t.TransferMax, o.TransferMax)
	t.WaitSum += o.WaitSum
	t.WaitMax = max(t.WaitMax, o.WaitMax)
	t.GPUCopySum += o.GPUCopySum
	t.GPUCheckSum += o.GPUCheckSum
}
