package daemon

import (
	"errors"

	"github.com/kvctl/kvctl/core/connector"
)

// protocolStatus turns the error of a worker call into the engine's gRPC status. An engine that
// broke the connector protocol (a misreported request id, or failed loads it never took) gets
// FailedPrecondition with the reason. The worker keeps that error, so every later call of the
// engine fails the same way while other engines go on; the reason is logged when the call that
// broke the protocol fails, that is when the worker had no error before it (prior).
func (s *service) protocolStatus(engine string, prior, err error) error {
	if prior == nil && (errors.Is(err, connector.ErrMisreportedRequest) || errors.Is(err, connector.ErrFailedLoadsNotTaken)) {
		s.d.log.Error("engine broke the connector protocol; its connector is stopped", "engine", engine, "reason", err.Error())
	}
	return statusOf(err)
}
