package config

import (
	"fmt"
	"time"
)

// ServeSecurity holds the serve settings that decide who may reach the daemon and what the admin
// API may do (see docs/SECURITY.md). It is embedded in ServeConfig.
type ServeSecurity struct {
	// EngineGroup names a group (name or gid) whose members may use the engine socket besides
	// the daemon's own user; "" admits only the daemon's user.
	EngineGroup string `json:"engine-group,omitempty" yaml:"engine-group,omitempty"`
	// MaxConns caps concurrent connections per listener; 0 takes the daemon's default.
	MaxConns int `json:"max-conns,omitempty" yaml:"max-conns,omitempty"`
	// AdminGrantsLeases lets the admin API's /query_key grant read leases (probe-pool
	// --renew-leases needs it).
	AdminGrantsLeases bool `json:"admin-grants-leases,omitempty" yaml:"admin-grants-leases,omitempty"`
	// AdminLeaseRate bounds /query_key lease grants per second; 0 takes the default.
	AdminLeaseRate float64 `json:"admin-lease-rate,omitempty" yaml:"admin-lease-rate,omitempty"`
	// AdminPprof serves Go's runtime profiles (CPU, heap, goroutines, execution trace) under
	// /debug/pprof/ on the admin listener.
	AdminPprof bool `json:"admin-pprof,omitempty" yaml:"admin-pprof,omitempty"`
	// DescriptorTTL is how long a descriptor sent over the side channel waits to be claimed by a
	// Register; 0 takes the default (30 s).
	DescriptorTTL time.Duration `json:"descriptor-ttl,omitempty" yaml:"descriptor-ttl,omitempty"`
	// MaxTrackedTokens is the daemon-wide budget of tokens the engines' unfinished requests may
	// hold; 0 derives it from the memory available at start.
	MaxTrackedTokens int64 `json:"max-tracked-tokens,omitempty" yaml:"max-tracked-tokens,omitempty"`
}

// Serve security config keys, which are also flag names of `kvctl serve`.
const (
	ServeKeyEngineGroup       = "engine-group"
	ServeKeyMaxConns          = "max-conns"
	ServeKeyAdminGrantsLeases = "admin-grants-leases"
	ServeKeyAdminLeaseRate    = "admin-lease-rate"
	ServeKeyAdminPprof        = "admin-pprof"
	ServeKeyDescriptorTTL     = "descriptor-ttl"
	ServeKeyMaxTrackedTokens  = "max-tracked-tokens"
)

func serveSecurityKeys() []string {
	return []string{ServeKeyEngineGroup, ServeKeyMaxConns, ServeKeyAdminGrantsLeases, ServeKeyAdminLeaseRate, ServeKeyAdminPprof, ServeKeyDescriptorTTL, ServeKeyMaxTrackedTokens}
}

// RemoteAdminWarning is what serve prints and validate-config reports when the admin API may
// listen beyond loopback: what anyone who reaches the port gets.
const RemoteAdminWarning = "allow-remote-admin exposes the admin API without authentication: every pool key (/get_all_keys, which reveal which prompts were cached), per-engine stats and model keys (/v1/stats), segment layout and /metrics to anyone who can reach the port"

// AdminPprofRemoteWarning is what validate-config and serve report when the profiles may be
// served beyond loopback.
const AdminPprofRemoteWarning = "with allow-remote-admin, anyone who reaches the admin port can read the daemon's goroutine stacks and heap profile and make it spend CPU on profiling"

func decodeServeSecurity(o *obj, s *ServeSecurity) {
	o.str(ServeKeyEngineGroup, &s.EngineGroup, true)
	if v, n, ok := o.intv(ServeKeyMaxConns, intExact); ok {
		if v < 0 || v > 1<<20 {
			o.errAt(n, ServeKeyMaxConns, fmt.Sprintf("must be in [0, %d], found %d", 1<<20, v), "0 takes the default")
		} else {
			s.MaxConns = int(v)
		}
	}
	if v, ok := o.boolv(ServeKeyAdminGrantsLeases, boolStrict); ok {
		s.AdminGrantsLeases = v
	}
	if v, ok := o.boolv(ServeKeyAdminPprof, boolStrict); ok {
		s.AdminPprof = v
	}
	var rate *float64
	o.floatPtr(ServeKeyAdminLeaseRate, &rate, true)
	if rate != nil {
		s.AdminLeaseRate = *rate
	}
	if n := o.field(ServeKeyDescriptorTTL); n != nil && !isNull(n) {
		s.DescriptorTTL = readDuration(o, ServeKeyDescriptorTTL, n)
	}
	if v, n, ok := o.intv(ServeKeyMaxTrackedTokens, intExact); ok {
		if v < 0 {
			o.errAt(n, ServeKeyMaxTrackedTokens, fmt.Sprintf("must not be negative, found %d", v), "0 derives it from available memory")
		} else {
			s.MaxTrackedTokens = v
		}
	}
}

func (s ServeConfig) validateSecurity(d *dec) {
	if s.AllowRemoteAdmin {
		d.at(SeverityWarning, ServeKeyAllowRemoteAdmin, RemoteAdminWarning, "keep the admin address on loopback and reach it through an authenticating proxy or an SSH tunnel")
	}
	if s.AdminGrantsLeases && s.AllowRemoteAdmin {
		d.at(SeverityWarning, ServeKeyAdminGrantsLeases, "with allow-remote-admin, anyone who reaches the admin port can pin pool keys with read leases (rate-limited by admin-lease-rate)", "")
	}
	if s.AdminPprof && s.AllowRemoteAdmin {
		d.at(SeverityWarning, ServeKeyAdminPprof, AdminPprofRemoteWarning, "profile through an SSH tunnel to a loopback admin address instead")
	}
	if s.MaxConns < 0 {
		d.at(SeverityError, ServeKeyMaxConns, fmt.Sprintf("must not be negative, found %d", s.MaxConns), "0 takes the default")
	}
	if s.DescriptorTTL < 0 {
		d.at(SeverityError, ServeKeyDescriptorTTL, "must not be negative", "0 takes the default of 30s")
	}
	if s.MaxTrackedTokens < 0 {
		d.at(SeverityError, ServeKeyMaxTrackedTokens, fmt.Sprintf("must not be negative, found %d", s.MaxTrackedTokens), "0 derives it from available memory")
	}
	if s.AdminLeaseRate < 0 {
		d.at(SeverityError, ServeKeyAdminLeaseRate, fmt.Sprintf("must not be negative, found %g", s.AdminLeaseRate), "0 takes the default")
	}
}
