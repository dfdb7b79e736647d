package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"time"
)

// ServeConfig is kvctl's own config file for `kvctl serve`. Its keys are the command's flag
// names, so a flag, a KVCTL_* variable and a file key name the same setting.
type ServeConfig struct {
	Socket             string        `json:"socket" yaml:"socket"`         // engine API socket; "" picks the default path
	AdminAddr          string        `json:"admin-addr" yaml:"admin-addr"` // admin HTTP; "" turns it off
	PoolBackend        string        `json:"pool-backend" yaml:"pool-backend"`
	Pool               string        `json:"pool,omitempty" yaml:"pool,omitempty"` // mooncake backend: file://<manifest> or host:port
	PoolSize           string        `json:"pool-size" yaml:"pool-size"`           // memory this host gives the pool; "" = auto
	StagingBufferBytes int64         `json:"staging-buffer-bytes" yaml:"staging-buffer-bytes"`
	LogLevel           string        `json:"log-level" yaml:"log-level"`
	LogFormat          string        `json:"log-format" yaml:"log-format"`
	StatsInterval      time.Duration `json:"stats-interval" yaml:"stats-interval"` // 0 = off
	// AllowRemoteAdmin lets AdminAddr be a non-loopback address (the admin API has no auth).
	AllowRemoteAdmin bool `json:"allow-remote-admin" yaml:"allow-remote-admin"`
	// DrainTimeout bounds how long a stopping daemon waits for queued saves.
	DrainTimeout time.Duration `json:"drain-timeout" yaml:"drain-timeout"`
	// MetricsAddr is the metrics and health listener (/metrics, /healthz, /readyz only); it
	// may bind any address. "" turns it off.
	MetricsAddr string `json:"metrics-addr,omitempty" yaml:"metrics-addr,omitempty"`
	// DisaggConfig is TensorRT-LLM's disagg_config.yaml: serve runs the disaggregated front it
	// describes instead of the connector daemon.
	DisaggConfig string `json:"disagg-config,omitempty" yaml:"disagg-config,omitempty"`
	// EngineMetricsRetention is how long an engine's per-rank series outlive it.
	EngineMetricsRetention time.Duration `json:"engine-metrics-retention,omitempty" yaml:"engine-metrics-retention,omitempty"`
	// PoolPrefault makes the embedded pool's memory resident at start (embedded.Options.Prefault).
	PoolPrefault bool `json:"pool-prefault,omitempty" yaml:"pool-prefault,omitempty"`
	// CallChannelPoll is how long a call channel keeps polling for an engine's next call before
	// it sleeps (daemon.Config.CallChannelPoll): 0 takes the default (200µs on a host with 4 or
	// more CPUs, none on a smaller one), a negative value turns polling off.
	CallChannelPoll time.Duration `json:"call-channel-poll,omitempty" yaml:"call-channel-poll,omitempty"`

	// The mooncake backend's keys (cluster.go): the master, the metadata server, this host's
	// address and donated memory, the transfer settings, and an existing mooncake.json.
	ClusterKeys `yaml:",inline"`
	// ServeSecurity holds the socket, connection and admin API settings (serve_security.go).
	ServeSecurity `yaml:",inline"`
}

// Serve config keys, which are also the flag names of `kvctl serve`.
const (
	ServeKeySocket             = "socket"
	ServeKeyAdminAddr          = "admin-addr"
	ServeKeyPoolBackend        = "pool-backend"
	ServeKeyPool               = "pool"
	ServeKeyPoolSize           = "pool-size"
	ServeKeyPoolPrefault       = "pool-prefault"
	ServeKeyStagingBufferBytes = "staging-buffer-bytes"
	ServeKeyLogLevel           = "log-level"
	ServeKeyLogFormat          = "log-format"
	ServeKeyStatsInterval      = "stats-interval"
	ServeKeyAllowRemoteAdmin   = "allow-remote-admin"
	ServeKeyDrainTimeout       = "drain-timeout"
	ServeKeyMetricsAddr        = "metrics-addr"
	ServeKeyEngineMetricsTTL   = "engine-metrics-retention"
	ServeKeyDisaggConfig       = "disagg-config"
	ServeKeyCallChannelPoll    = "call-channel-poll"
)

// MaxCallChannelPoll is the longest call channel poll window a config may ask for: a longer one
// keeps a core busy well past an engine's burst of calls.
const MaxCallChannelPoll = 10 * time.Millisecond

// globalKeys are kvctl's global flags, which may share the config file with serve's keys.
var globalKeys = []string{"output", "no-color"}

// ServeKeys lists every serve config key, in the order the help text shows them.
func ServeKeys() []string {
	return append([]string{ServeKeySocket, ServeKeyAdminAddr, ServeKeyPoolBackend, ServeKeyPool, ServeKeyPoolSize, ServeKeyPoolPrefault,
		ServeKeyStagingBufferBytes, ServeKeyLogLevel, ServeKeyLogFormat, ServeKeyStatsInterval,
		ServeKeyAllowRemoteAdmin, ServeKeyDrainTimeout, ServeKeyMetricsAddr, ServeKeyEngineMetricsTTL, ServeKeyCallChannelPoll, ServeKeyDisaggConfig,
		ServeKeyMaster, ServeKeyMetadata, ServeKeyHostAddress, ServeKeyLocalBufferSize, ServeKeyProtocol,
		ServeKeyDeviceName, ServeKeyMooncakeConfig, ServeKeyPoolTimeout, ServeKeyMasterAdmin, ServeKeyTransferPort, ServeKeyObjectChecksum, ServeKeyLocateWindow}, serveSecurityKeys()...)
}

// Pool backends of `kvctl serve`.
const (
	PoolBackendEmbedded = "embedded"
	PoolBackendMooncake = "mooncake"
)

// PoolBackends are the pool-backend values a serve config accepts; each has an entry in the
// backend registry (pool.Register), which a test keeps in step with this list.
var PoolBackends = []string{PoolBackendEmbedded, PoolBackendMooncake}

// DefaultServeConfig returns the settings serve runs with when nothing is set.
func DefaultServeConfig() ServeConfig {
	return ServeConfig{
		AdminAddr:          "127.0.0.1:9480",
		PoolBackend:        PoolBackendEmbedded,
		StagingBufferBytes: DefaultStagingBufferBytes,
		LogLevel:           "info",
		LogFormat:          "text",
		DrainTimeout:       30 * time.Second,
		// Matches daemon.DefaultEngineSeriesRetention.
		EngineMetricsRetention: 15 * time.Minute,
	}
}

// PoolSizeBytes is the memory this host gives the pool (the embedded pool, or its segment of a
// Mooncake cluster); ok is false for "" or "auto" (sized automatically).
func (s ServeConfig) PoolSizeBytes() (n int64, ok bool, err error) {
	if s.PoolSize == "" || s.PoolSize == "auto" {
		return 0, false, nil
	}
	n, err = ParseSize(s.PoolSize, true)
	return n, err == nil, err
}

// Validate checks every value rule of a serve config built from flags, the environment and
// a file, returning all problems at once.
func (s ServeConfig) Validate() Diagnostics {
	d := newDec("")
	s.validate(d)
	return d.diags
}

// maxSocketPath is the longest path a Linux unix socket address holds.
const maxSocketPath = 107

func (s ServeConfig) validate(d *dec) {
	if len(s.Socket) > maxSocketPath {
		d.at(SeverityError, ServeKeySocket, fmt.Sprintf("the socket path is %d bytes; a unix socket path holds at most %d", len(s.Socket), maxSocketPath),
			"use a shorter directory, such as $XDG_RUNTIME_DIR")
	}
	if s.AdminAddr != "" {
		if _, port, err := net.SplitHostPort(s.AdminAddr); err != nil || port == "" {
			d.at(SeverityError, ServeKeyAdminAddr, fmt.Sprintf("%q is not host:port", s.AdminAddr), "for example 127.0.0.1:9480")
		}
	}
	if s.MetricsAddr != "" {
		if _, port, err := net.SplitHostPort(s.MetricsAddr); err != nil || port == "" {
			d.at(SeverityError, ServeKeyMetricsAddr, fmt.Sprintf("%q is not host:port", s.MetricsAddr), "for example :9481 or 0.0.0.0:9481")
		} else if s.AdminAddr != "" && s.MetricsAddr == s.AdminAddr {
			d.at(SeverityError, ServeKeyMetricsAddr, "the metrics listener needs an address of its own, not the admin address", "for example :9481")
		}
	}
	if s.EngineMetricsRetention < 0 {
		d.at(SeverityError, ServeKeyEngineMetricsTTL, "must not be negative", "for example 15m")
	}
	switch s.PoolBackend {
	case PoolBackendEmbedded:
		if s.Pool != "" {
			d.at(SeverityWarning, ServeKeyPool, "pool is read only by the mooncake backend", "")
		}
		s.warnUnused(d)
	case PoolBackendMooncake:
		if s.PoolPrefault {
			d.at(SeverityWarning, ServeKeyPoolPrefault, "pool-prefault is read only by the embedded backend", "")
		}
		if s.Pool != "" {
			if _, _, err := ParsePoolRef(s.Pool); err != nil {
				d.at(SeverityError, ServeKeyPool, err.Error(), "write file:///path/pool.json or host:port")
			}
		}
		s.validateCluster(d)
	default:
		d.at(SeverityError, ServeKeyPoolBackend, fmt.Sprintf("unknown pool backend %q", s.PoolBackend), "use embedded or mooncake")
	}
	if _, _, err := s.PoolSizeBytes(); err != nil {
		msg, hint := err.Error(), ""
		if se := (*SizeError)(nil); errors.As(err, &se) {
			msg, hint = se.Value+": "+se.Reason, se.Hint
		}
		d.at(SeverityError, ServeKeyPoolSize, msg, hint)
	}
	if s.StagingBufferBytes <= 0 {
		d.at(SeverityError, ServeKeyStagingBufferBytes, fmt.Sprintf("must be greater than 0, found %d", s.StagingBufferBytes), "")
	}
	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		d.at(SeverityError, ServeKeyLogLevel, fmt.Sprintf("unknown log level %q", s.LogLevel), "use debug, info, warn or error")
	}
	switch s.LogFormat {
	case "text", "json":
	default:
		d.at(SeverityError, ServeKeyLogFormat, fmt.Sprintf("unknown log format %q", s.LogFormat), "use text or json")
	}
	if s.DrainTimeout < 0 {
		d.at(SeverityError, ServeKeyDrainTimeout, "must not be negative", "for example 30s")
	}
	if s.StatsInterval < 0 {
		d.at(SeverityError, ServeKeyStatsInterval, "must not be negative", "0 turns stats off")
	}
	if s.CallChannelPoll > MaxCallChannelPoll {
		d.at(SeverityError, ServeKeyCallChannelPoll, fmt.Sprintf("%v is longer than the most, %v: a call channel would keep a core busy long after an engine's calls", s.CallChannelPoll, MaxCallChannelPoll),
			"0 takes the default (200µs with 4 or more CPUs), a negative value turns polling off")
	}
	s.validateSecurity(d)
}

func decodeServe(d *dec, root *node, otherKeys []string) *ServeConfig {
	s := DefaultServeConfig()
	o := d.object(root, "")
	o.str(ServeKeySocket, &s.Socket, true)
	o.str(ServeKeyAdminAddr, &s.AdminAddr, true)
	o.str(ServeKeyPoolBackend, &s.PoolBackend, false)
	o.str(ServeKeyPool, &s.Pool, true)
	if n := o.field(ServeKeyPoolSize); n != nil && !isNull(n) {
		if n.kind == nodeScalar && (n.typ == scalarInt || n.typ == scalarString) {
			s.PoolSize = n.text
		} else {
			o.errAt(n, ServeKeyPoolSize, "want a size such as \"64GiB\", found "+n.describe(), "")
		}
	}
	var staging *Size
	o.sizePtr(ServeKeyStagingBufferBytes, &staging, true, -1<<63)
	if staging != nil {
		s.StagingBufferBytes = staging.Bytes
	}
	o.str(ServeKeyLogLevel, &s.LogLevel, false)
	o.str(ServeKeyLogFormat, &s.LogFormat, false)
	if n := o.field(ServeKeyStatsInterval); n != nil && !isNull(n) {
		s.StatsInterval = readDuration(o, ServeKeyStatsInterval, n)
	}
	if n := o.field(ServeKeyDrainTimeout); n != nil && !isNull(n) {
		s.DrainTimeout = readDuration(o, ServeKeyDrainTimeout, n)
	}
	o.str(ServeKeyMetricsAddr, &s.MetricsAddr, true)
	o.str(ServeKeyDisaggConfig, &s.DisaggConfig, true)
	if n := o.field(ServeKeyEngineMetricsTTL); n != nil && !isNull(n) {
		s.EngineMetricsRetention = readDuration(o, ServeKeyEngineMetricsTTL, n)
	}
	if n := o.field(ServeKeyCallChannelPoll); n != nil && !isNull(n) {
		s.CallChannelPoll = readDuration(o, ServeKeyCallChannelPoll, n)
	}
	if v, ok := o.boolv(ServeKeyAllowRemoteAdmin, boolStrict); ok {
		s.AllowRemoteAdmin = v
	}
	if v, ok := o.boolv(ServeKeyPoolPrefault, boolStrict); ok {
		s.PoolPrefault = v
	}
	decodeClusterKeys(o, &s.ClusterKeys)
	decodeServeSecurity(o, &s.ServeSecurity)
	for _, k := range globalKeys {
		o.field(k)
	}
	for _, k := range otherKeys {
		o.field(k)
	}
	o.rest(SeverityError, "")
	s.validate(d)
	return &s
}

// readDuration accepts a Go duration string ("30s") or a number of seconds.
func readDuration(o *obj, key string, n *node) time.Duration {
	if n.kind == nodeScalar {
		switch n.typ {
		case scalarString:
			if v, err := time.ParseDuration(n.text); err == nil {
				return v
			}
		case scalarInt:
			if !n.overflow && n.i >= -math.MaxInt64/int64(time.Second) && n.i <= math.MaxInt64/int64(time.Second) {
				return time.Duration(n.i) * time.Second
			}
		case scalarFloat:
			if n.f == n.f && math.Abs(n.f) < math.MaxInt64/float64(time.Second) {
				return time.Duration(n.f * float64(time.Second))
			}
		}
	}
	o.errAt(n, key, "want a duration such as \"30s\" or a number of seconds, found "+n.describe(), "")
	return 0
}
