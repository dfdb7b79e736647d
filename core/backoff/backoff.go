// Package backoff is kvctl's one exponential backoff: doubling waits between Min and Max, each
// drawn with jitter from the upper half of the current step, so that a fleet of hosts that lost
// the same master (or listeners that hit the same file limit) do not retry in lockstep.
//
// It is a leaf: it imports no kvctl package, so the wire-format leaves (mooncake/masterrpc,
// mooncake/transfer) and the daemon share it.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff is one retry loop's state. The zero value with Min and Max set is ready; it is not
// safe for concurrent use (the owner holds the lock that guards its retries).
type Backoff struct {
	Min, Max time.Duration
	// Rand returns a float in [0, 1); nil takes math/rand/v2's.
	Rand func() float64

	step time.Duration
}

// Next returns the wait before the next attempt: the step doubles from Min up to Max, and the
// wait is uniform in [step/2, step].
func (b *Backoff) Next() time.Duration {
	if b.step == 0 {
		b.step = b.Min
	} else {
		b.step = min(2*b.step, b.Max)
	}
	b.step = max(b.step, b.Min)
	r := b.Rand
	if r == nil {
		r = rand.Float64
	}
	half := b.step / 2
	return half + time.Duration(r()*float64(b.step-half))
}

// Reset starts over from Min after a success.
func (b *Backoff) Reset() { b.step = 0 }

// Step is the current step, the longest the last Next could have returned (0 after Reset).
func (b *Backoff) Step() time.Duration { return b.step }
