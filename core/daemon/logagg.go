package daemon

import (
	"context"
	"log"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
)

// DefaultFaultLogInterval is the window over which repeated warnings are folded into one line.
const DefaultFaultLogInterval = 10 * time.Second

// maxAggregatedKinds bounds the distinct warnings tracked in one window; beyond it, further
// kinds are counted together under one line, so a flood of distinct messages cannot grow the
// table.
const maxAggregatedKinds = 1024

// aggregator folds repeated warnings: the first warning of a kind in a window is logged as it
// comes, later ones of that kind are only counted, and when the window ends one line per kind
// says how many were folded. A kind is the message and the record's attributes with their digits
// blanked, plus the logger's own attributes (so two engines' warnings stay apart). Records below
// WARN pass unchanged.
type aggregator struct {
	inner    slog.Handler
	interval time.Duration

	mu     sync.Mutex
	kinds  map[string]*aggKind
	other  int64
	done   chan struct{}
	closed bool
	wg     sync.WaitGroup
}

type aggKind struct {
	h       slog.Handler // the handler (with its attributes) the kind was first logged through
	level   slog.Level
	msg     string
	dropped int64
}

func newAggregator(inner slog.Handler, interval time.Duration) *aggregator {
	a := &aggregator{inner: inner, interval: interval, kinds: map[string]*aggKind{}, done: make(chan struct{})}
	a.wg.Add(1)
	go a.loop()
	return a
}

func (a *aggregator) loop() {
	defer a.wg.Done()
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			a.flush()
		case <-a.done:
			a.flush()
			return
		}
	}
}

// stop writes the last window's counts and ends the timer.
func (a *aggregator) stop() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	a.mu.Unlock()
	close(a.done)
	a.wg.Wait()
}

// flush writes one line per kind that was folded in the window ending now and starts the next.
func (a *aggregator) flush() {
	a.mu.Lock()
	kinds, other := a.kinds, a.other
	a.kinds, a.other = map[string]*aggKind{}, 0
	a.mu.Unlock()
	keys := make([]string, 0, len(kinds))
	for k, v := range kinds {
		if v.dropped > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	ctx := context.Background()
	for _, k := range keys {
		v := kinds[k]
		r := slog.NewRecord(time.Now(), v.level, v.msg+" (repeated)", 0)
		r.AddAttrs(slog.Int64("repeated", v.dropped), slog.Duration("interval", a.interval))
		_ = v.h.Handle(ctx, r)
	}
	if other > 0 {
		r := slog.NewRecord(time.Now(), slog.LevelWarn, "further warnings of other kinds (repeated)", 0)
		r.AddAttrs(slog.Int64("repeated", other), slog.Duration("interval", a.interval))
		_ = a.inner.Handle(ctx, r)
	}
}

// handler returns the slog.Handler that feeds the aggregator.
func (a *aggregator) handler() slog.Handler { return &aggHandler{a: a, inner: a.inner} }

type aggHandler struct {
	a     *aggregator
	inner slog.Handler
	scope string // the attributes and groups added with WithAttrs/WithGroup, for the kind key
}

func (h *aggHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *aggHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.inner.Handle(ctx, r)
	}
	var kb strings.Builder
	kb.WriteString(h.scope)
	kb.WriteByte(0)
	kb.WriteString(r.Level.String())
	kb.WriteByte(0)
	kb.WriteString(r.Message)
	r.Attrs(func(at slog.Attr) bool {
		kb.WriteByte(' ')
		kb.WriteString(at.String())
		return true
	})
	key := blankDigits(kb.String())
	a := h.a
	a.mu.Lock()
	k, seen := a.kinds[key]
	switch {
	case seen:
		k.dropped++
		a.mu.Unlock()
		return nil
	case len(a.kinds) >= maxAggregatedKinds:
		a.other++
		a.mu.Unlock()
		return nil
	}
	a.kinds[key] = &aggKind{h: h.inner, level: r.Level, msg: r.Message}
	a.mu.Unlock()
	return h.inner.Handle(ctx, r)
}

func (h *aggHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(h.scope)
	for _, at := range attrs {
		b.WriteString(at.String())
		b.WriteByte(' ')
	}
	return &aggHandler{a: h.a, inner: h.inner.WithAttrs(attrs), scope: b.String()}
}

func (h *aggHandler) WithGroup(name string) slog.Handler {
	return &aggHandler{a: h.a, inner: h.inner.WithGroup(name), scope: h.scope + name + "."}
}

// blankDigits replaces every run of digits with '#', so messages that differ only in counts,
// ranks or sizes are one kind.
func blankDigits(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	inRun := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= '0' && c <= '9' {
			if !inRun {
				b.WriteByte('#')
			}
			inRun = true
			continue
		}
		inRun = false
		b.WriteByte(c)
	}
	return b.String()
}

// slogErrorLog routes a net/http server's error log (accept errors, bad handshakes) through l at
// WARN, so it is folded like every other warning.
func slogErrorLog(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelWarn)
}
