package daemon

// SetDraining puts the daemon in (or out of) the state it is in once a shutdown has begun, when
// every new call is refused, so that tests can check that a call channel's calls are refused as
// gRPC calls are without racing a real shutdown.
func SetDraining(d *Daemon, on bool) { d.draining.Store(on) }
