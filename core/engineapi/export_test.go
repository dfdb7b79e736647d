package engineapi

import (
	"net"
	"time"
)

// HoldIdleChannel takes an idle channel out of p, as a call in flight would, and returns the
// function that gives it back.
func HoldIdleChannel(p *CallChannels) (release func(), ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if n == 0 {
		return nil, false
	}
	c := p.idle[n-1]
	p.idle = p.idle[:n-1]
	return func() { p.put(c) }, true
}

// AdoptChannel makes conn, the engine's end of a socket pair whose other end the test holds, an
// idle channel of p with request bound maxReq: the test then plays the daemon.
func AdoptChannel(p *CallChannels, conn *net.UnixConn, maxReq int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.idle = append(p.idle, &callConn{conn: conn, rbuf: make([]byte, MaxCallFrameBytes+1), asm: NewCallAssembler(MaxMessageBytes)})
	p.open++
	p.maxReq = maxReq
}

// DialFailures is how many channels p could not open.
func DialFailures(p *CallChannels) int64 { return p.dialFailures.Load() }

// SetIdleTimeout sets the gRPC idle timeout of clients dialled from now on, and returns the
// function that restores it.
func SetIdleTimeout(d time.Duration) (restore func()) {
	old := idleTimeout
	idleTimeout = d
	return func() { idleTimeout = old }
}
