package stats

import (
	"sync"
	"time"
)

// SaveSample is what one save job did: the pages it was given, those it skipped because the
// pool already held them, those it put, and those the pool refused or failed.
type SaveSample struct {
	Pages        int64 // pages the job was asked to save
	SkippedPages int64 // pages already in the pool, not written again
	PutPages     int64 // pages the pool accepted: stored, or found stored by a concurrent save
	PutBytes     int64 // bytes of the accepted pages
	FailedPages  int64 // pages whose put failed (pool full, transfer error)
	RefusedPages int64 // pages the pool refused as invalid (a soft-pin TTL above its limit)
	// NotJoinedPages were not saved because this host had not joined the pool yet (a Mooncake
	// cluster's segment not mounted): the pool was not asked, so they are not failures; another
	// host may hold them.
	NotJoinedPages int64
	Duration       time.Duration // from the fence passing to the last put's answer
	Err            bool          // the job stopped on an error before it was done
}

// SaveTotals is the sum of save samples.
type SaveTotals struct {
	Saves        int64 // save jobs
	FailedSaves  int64 // jobs that stopped on an error or lost at least one page
	Pages        int64
	SkippedPages int64
	PutPages     int64
	PutBytes     int64
	FailedPages  int64
	RefusedPages int64
	// NotJoinedSaves are jobs that saved nothing for NotJoinedPages (and lost no page otherwise).
	NotJoinedSaves int64
	NotJoinedPages int64
	Duration       time.Duration
}

// Add folds one sample in.
func (t *SaveTotals) Add(s SaveSample) {
	t.Saves++
	if s.Err || s.FailedPages > 0 || s.RefusedPages > 0 {
		t.FailedSaves++
	} else if s.NotJoinedPages > 0 {
		t.NotJoinedSaves++
	}
	t.NotJoinedPages += s.NotJoinedPages
	t.Pages += s.Pages
	t.SkippedPages += s.SkippedPages
	t.PutPages += s.PutPages
	t.PutBytes += s.PutBytes
	t.FailedPages += s.FailedPages
	t.RefusedPages += s.RefusedPages
	t.Duration += s.Duration
}

// Merge adds the totals of o to t.
func (t *SaveTotals) Merge(o SaveTotals) {
	t.Saves += o.Saves
	t.FailedSaves += o.FailedSaves
	t.Pages += o.Pages
	t.SkippedPages += o.SkippedPages
	t.PutPages += o.PutPages
	t.PutBytes += o.PutBytes
	t.FailedPages += o.FailedPages
	t.RefusedPages += o.RefusedPages
	t.NotJoinedSaves += o.NotJoinedSaves
	t.NotJoinedPages += o.NotJoinedPages
	t.Duration += o.Duration
}

// saveStats accumulates save samples; safe for concurrent use.
type saveStats struct {
	mu    sync.Mutex
	total SaveTotals
}

func (s *saveStats) record(x SaveSample) {
	s.mu.Lock()
	s.total.Add(x)
	s.mu.Unlock()
}

func (s *saveStats) totals() SaveTotals {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Observer receives the duration of every load and save a reporter records, for latency
// histograms kept outside the reporter (a daemon keeps one set for all its engines). Its
// methods are called from the goroutines that record and must be safe for concurrent use.
type Observer interface {
	ObserveLoad(d time.Duration, failed bool)
	ObserveSave(d time.Duration, failed bool)
}

// RecordSave folds one save job in.
func (r *Reporter) RecordSave(s SaveSample) {
	if r == nil {
		return
	}
	r.saves.record(s)
	if r.obs != nil {
		r.obs.ObserveSave(s.Duration, s.Err || s.FailedPages > 0 || s.RefusedPages > 0)
	}
}

// SaveTotals returns the save stats recorded since the reporter was made.
func (r *Reporter) SaveTotals() SaveTotals {
	if r == nil {
		return SaveTotals{}
	}
	return r.saves.totals()
}

// LoadQueue returns the asynchronous loads queued and in progress, as last set.
func (r *Reporter) LoadQueue() (queued, active int) {
	if r == nil {
		return 0, 0
	}
	r.loads.mu.Lock()
	defer r.loads.mu.Unlock()
	return r.loads.queued, r.loads.active
}
