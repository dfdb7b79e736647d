package connector

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Rank is what one engine rank calls on its connector, in process or over the engine API:
// the scheduler adapter's half (Lookup to RequestReset), which only a rank that runs the
// scheduler adapter answers, and the worker's half (BindMeta to DropBoundSaves), which every
// rank answers. LocalRank implements it over a Scheduler and a Worker, engineapi.RemoteRank
// over the engine API client; Driver runs requests through it.
//
// A Rank is used by one engine loop at a time: its calls follow the engine's pass order, so
// implementations need not be safe for concurrent use beyond what Scheduler and Worker are.
// Slices passed in stay the caller's; slices returned are the caller's to keep.
type Rank interface {
	// Name names the rank in errors: the registered engine name, or what the engine chose.
	Name() string
	// Declarations is what the connector declares to the engine's KV cache manager, after the
	// manager's rules for the rank's role (ReadDeclarations).
	Declarations() Declarations

	// Lookup is Scheduler.Lookup.
	Lookup(ctx context.Context, req Request, numComputedTokens int) (matchedTokens int, async bool, err error)
	// AdmissionQuery is Scheduler.AdmissionQuery.
	AdmissionQuery(ctx context.Context, req Request, numComputedTokens int) (matchedTokens int, async bool, err error)
	// CancelLoad is Scheduler.CancelLoad.
	CancelLoad(ctx context.Context, reqID string, start, end int) error
	// UpdateStateAfterAlloc is Scheduler.UpdateStateAfterAlloc.
	UpdateStateAfterAlloc(ctx context.Context, reqID string, blockIDsByGroup [][]int, honouredTokens int) error
	// BuildMeta is Scheduler.BuildMeta.
	BuildMeta(ctx context.Context, out SchedulerOutput) (Metadata, error)
	// RequestFinished is Scheduler.RequestFinished.
	RequestFinished(ctx context.Context, reqID string) (asyncSaving bool, err error)
	// RequestReset is Scheduler.RequestReset.
	RequestReset(ctx context.Context, reqID string) error

	// BindMeta is Worker.BindMeta.
	BindMeta(ctx context.Context, meta Metadata) error
	// StartLoad is Worker.StartLoad.
	StartLoad(ctx context.Context) error
	// TakeFailedLoadRequests is Worker.TakeFailedLoadRequests.
	TakeFailedLoadRequests(ctx context.Context) ([]string, error)
	// TakeFailedAsyncLoadRequests is Worker.TakeFailedAsyncLoadRequests.
	TakeFailedAsyncLoadRequests(ctx context.Context) ([]string, error)
	// TakeSubmittedSaves is Worker.TakeSubmittedSaves.
	TakeSubmittedSaves(ctx context.Context) ([]string, error)
	// WaitForSave is Worker.WaitForSave.
	WaitForSave(ctx context.Context) error
	// GetFinished is Worker.GetFinished.
	GetFinished(ctx context.Context, finishedGen, startedLoading []string) (finishedSaving, finishedLoading []string, err error)
	// DropBoundSaves is Worker.DropBoundSaves.
	DropBoundSaves(ctx context.Context, ids []string) error
}

// FinishedWaiter is a Rank whose GetFinished can wait for something to report
// (Worker.GetFinishedWait): LocalRank, and engineapi.RemoteRank on a daemon that serves the
// wait.
type FinishedWaiter interface {
	GetFinishedWait(ctx context.Context, finishedGen, startedLoading []string, wait time.Duration) (finishedSaving, finishedLoading []string, err error)
}

// ErrNoScheduler is returned by a scheduler-adapter call on a rank that runs none.
var ErrNoScheduler = errors.New("rank runs no scheduler adapter")

// LocalRank is a Rank over a Scheduler and a Worker in this process.
type LocalRank struct {
	name  string
	sched *Scheduler
	w     *Worker
}

// NewLocalRank returns the rank named name over s (nil on a rank without the scheduler adapter)
// and w. The caller keeps ownership of both and closes them. When both were made with
// Options.EarlyLoads they are linked (LinkEarlyLoads).
func NewLocalRank(name string, s *Scheduler, w *Worker) *LocalRank {
	if s != nil && w != nil && s.opts.EarlyLoads && w.opts.EarlyLoads {
		_ = LinkEarlyLoads(s, w) // the same rank's options: only a namespace mismatch fails
	}
	return &LocalRank{name: name, sched: s, w: w}
}

// Scheduler returns the rank's scheduler adapter, nil where it runs none.
func (l *LocalRank) Scheduler() *Scheduler { return l.sched }

// Worker returns the rank's worker.
func (l *LocalRank) Worker() *Worker { return l.w }

// Name implements Rank.
func (l *LocalRank) Name() string { return l.name }

// Declarations implements Rank.
func (l *LocalRank) Declarations() Declarations {
	return ReadDeclarations(l.w.Declarations().Map(), l.w.opts.Role)
}

func (l *LocalRank) scheduler() (*Scheduler, error) {
	if l.sched == nil {
		return nil, fmt.Errorf("%s: %w", l.name, ErrNoScheduler)
	}
	return l.sched, nil
}

// Lookup implements Rank.
func (l *LocalRank) Lookup(ctx context.Context, req Request, numComputedTokens int) (int, bool, error) {
	s, err := l.scheduler()
	if err != nil {
		return 0, false, err
	}
	return s.Lookup(ctx, req, numComputedTokens)
}

// AdmissionQuery implements Rank.
func (l *LocalRank) AdmissionQuery(ctx context.Context, req Request, numComputedTokens int) (int, bool, error) {
	s, err := l.scheduler()
	if err != nil {
		return 0, false, err
	}
	return s.AdmissionQuery(ctx, req, numComputedTokens)
}

// CancelLoad implements Rank.
func (l *LocalRank) CancelLoad(_ context.Context, reqID string, start, end int) error {
	s, err := l.scheduler()
	if err != nil {
		return err
	}
	return s.CancelLoad(reqID, start, end)
}

// UpdateStateAfterAlloc implements Rank.
func (l *LocalRank) UpdateStateAfterAlloc(_ context.Context, reqID string, blockIDsByGroup [][]int, honouredTokens int) error {
	s, err := l.scheduler()
	if err != nil {
		return err
	}
	return s.UpdateStateAfterAlloc(reqID, blockIDsByGroup, honouredTokens, false)
}

// BuildMeta implements Rank.
func (l *LocalRank) BuildMeta(_ context.Context, out SchedulerOutput) (Metadata, error) {
	s, err := l.scheduler()
	if err != nil {
		return Metadata{}, err
	}
	return s.BuildMeta(out)
}

// RequestFinished implements Rank.
func (l *LocalRank) RequestFinished(_ context.Context, reqID string) (bool, error) {
	s, err := l.scheduler()
	if err != nil {
		return false, err
	}
	return s.RequestFinished(reqID, false), nil
}

// RequestReset implements Rank.
func (l *LocalRank) RequestReset(_ context.Context, reqID string) error {
	s, err := l.scheduler()
	if err != nil {
		return err
	}
	s.RequestReset(reqID, false)
	return nil
}

// BindMeta implements Rank.
func (l *LocalRank) BindMeta(_ context.Context, meta Metadata) error {
	l.w.BindMeta(meta)
	return nil
}

// StartLoad implements Rank.
func (l *LocalRank) StartLoad(ctx context.Context) error { return l.w.StartLoad(ctx) }

// TakeFailedLoadRequests implements Rank.
func (l *LocalRank) TakeFailedLoadRequests(context.Context) ([]string, error) {
	return l.w.TakeFailedLoadRequests(), nil
}

// TakeFailedAsyncLoadRequests implements Rank.
func (l *LocalRank) TakeFailedAsyncLoadRequests(context.Context) ([]string, error) {
	return l.w.TakeFailedAsyncLoadRequests(), nil
}

// TakeSubmittedSaves implements Rank.
func (l *LocalRank) TakeSubmittedSaves(context.Context) ([]string, error) {
	return l.w.TakeSubmittedSaves(), nil
}

// WaitForSave implements Rank.
func (l *LocalRank) WaitForSave(ctx context.Context) error { return l.w.WaitForSave(ctx) }

// GetFinished implements Rank.
func (l *LocalRank) GetFinished(_ context.Context, finishedGen, startedLoading []string) ([]string, []string, error) {
	return l.w.GetFinished(finishedGen, startedLoading)
}

// GetFinishedWait implements FinishedWaiter.
func (l *LocalRank) GetFinishedWait(ctx context.Context, finishedGen, startedLoading []string, wait time.Duration) ([]string, []string, error) {
	return l.w.GetFinishedWait(ctx, finishedGen, startedLoading, wait)
}

// DropBoundSaves implements Rank.
func (l *LocalRank) DropBoundSaves(_ context.Context, ids []string) error {
	return l.w.DropBoundSaves(ids)
}
