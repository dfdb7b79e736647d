package replay

import (
	"container/heap"
	"fmt"
	"time"

	"github.com/kvctl/kvctl/core/router"
)

// event is a modelled moment a router hears about: a request leaving the context phase or
// finishing.
type event struct {
	at       time.Duration
	seq      int
	id       string
	finished bool
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// popEvents applies the router events due by at.
func (o *offline) popEvents(at time.Duration) error {
	for len(o.ev) > 0 && o.ev[0].at <= at {
		e := heap.Pop(&o.ev).(event)
		var err error
		if e.finished {
			err = o.router.Finished(e.id)
		} else {
			err = o.router.ContextDone(e.id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (o *offline) push(at time.Duration, id string, finished bool) {
	o.seq++
	heap.Push(&o.ev, event{at: at, seq: o.seq, id: id, finished: finished})
}

// route places a batch, waiting for modelled finishes while a capped router cannot place a
// request; it returns each request's rank and the earliest modelled start.
//
// Under the scheduler model a placed request is handed to its rank at once (first is the
// batch's trace position), so that the passes a capped router waits on can run it.
func (o *offline) route(batch []Request, at time.Duration, first int) ([]int, []time.Duration, error) {
	ranks := make([]int, len(batch))
	starts := make([]time.Duration, len(batch))
	todo := make([]int, len(batch))
	for k := range todo {
		todo[k] = k
	}
	when := at
	for len(todo) > 0 {
		rq := make([]router.Request, len(todo))
		for n, k := range todo {
			rq[n] = o.routerRequest(batch[k])
		}
		pl, err := o.router.Route(rq)
		if err != nil {
			return nil, nil, err
		}
		var left []int
		for n, k := range todo {
			if pl[n].Rank == router.Unplaced {
				left = append(left, k)
				continue
			}
			ranks[k], starts[k] = pl[n].Rank, when
			if o.c.Scheduler {
				o.enqueue(first+k, batch[k], pl[n].Rank, when, pl[n].Estimate)
			}
			o.ranks[pl[n].Rank].load.EstimatedTokens += int64(pl[n].Estimate)
		}
		todo = left
		if len(todo) == 0 {
			break
		}
		if len(o.ev) == 0 && o.c.Scheduler {
			if _, err := o.runUntilEvent(); err != nil {
				return nil, nil, err
			}
		}
		if len(o.ev) == 0 {
			return nil, nil, fmt.Errorf("%d requests cannot be placed and no request is running", len(todo))
		}
		// Wait for the next modelled event to free a slot.
		next := o.ev[0].at
		if err := o.popEvents(next); err != nil {
			return nil, nil, err
		}
		when = max(when, next)
	}
	return ranks, starts, nil
}
