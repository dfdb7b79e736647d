package daemon

import (
	"fmt"

	"github.com/kvctl/kvctl/core/connector"
)

// SchedulerOf gives the lookup benchmarks the scheduler behind a registered engine, so that the
// in-process Lookup and the one over the socket are measured on the same daemon and pool. It
// skips the per-connection ownership check, which only calls over the socket go through.
func SchedulerOf(d *Daemon, engine string) (*connector.Scheduler, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	e := d.engines[engine]
	if e == nil || e.scheduler == nil {
		return nil, fmt.Errorf("engine %q is not registered with the scheduler adapter", engine)
	}
	return e.scheduler, nil
}
