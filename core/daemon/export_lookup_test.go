package daemon

import "github.com/kvctl/kvctl/core/connector"

// SchedulerOf gives the lookup benchmarks the scheduler behind a registered engine, so that the
// in-process Lookup and the one over the socket are measured on the same daemon and pool.
func SchedulerOf(d *Daemon, engine string) (*connector.Scheduler, error) {
	return d.schedulerOf(engine)
}
