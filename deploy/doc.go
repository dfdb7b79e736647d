// Package deploy holds the artefacts an operator ships kvctl serve with, and the tests that keep
// them working: a systemd unit (systemd/), a Kubernetes DaemonSet, Service and ServiceMonitor
// (kubernetes/), a Grafana dashboard (grafana/) and Prometheus alert rules with their unit
// tests (prometheus/). The package has no code; its tests check each artefact against the
// tools and API types that consume it, and every series a query names against the metric
// contract in core/daemon/testdata. start_test.go starts kvctl serve exactly as the systemd unit
// and the DaemonSet would (same user, directory owner and mode, flags and environment, through
// setpriv; as root) and checks the image the Dockerfile at the repository root describes.
package deploy
