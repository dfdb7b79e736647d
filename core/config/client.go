package config

import "fmt"

// Defaults of the client config (mooncake.json, read by MooncakeStoreConnectorConfig.from_file in
// TensorRT-LLM's mooncake_store/config.py, https://github.com/NVIDIA/TensorRT-LLM/pull/21195) and of the fields the seed adds
// (docs/SEED.md).
const (
	DefaultMetadataServer     = "P2PHANDSHAKE"
	DefaultProtocol           = "rdma"
	DefaultGlobalSegmentSize  = 3355443200
	DefaultLocalBufferSize    = 1 << 30
	DefaultNamespace          = "trtllm"
	DefaultTransferBatchSize  = 64
	DefaultStagingBufferBytes = 1 << 30
	DefaultAsyncLoadWorkers   = 1
	// MaxSoftPinTTLMs is the Mooncake master's default --max_kv_soft_pin_ttl (24 h). A put that
	// asks for a longer soft pin is refused by such a master.
	MaxSoftPinTTLMs = 86_400_000
)

// ClientConfig is the Mooncake client config, mooncake.json. Optional fields are nil when
// the file leaves them out (or writes null); the seed's six fields are kept nil when absent so
// a rendered file names only what the deployment set.
type ClientConfig struct {
	MasterServerAddress string  `json:"master_server_address"`
	MetadataServer      string  `json:"metadata_server"`
	Protocol            string  `json:"protocol"`
	DeviceName          string  `json:"device_name"`
	GlobalSegmentSize   int64   `json:"global_segment_size"`
	LocalBufferSize     int64   `json:"local_buffer_size"`
	LocalHostname       *string `json:"local_hostname,omitempty"`
	TenantID            *string `json:"tenant_id,omitempty"`
	Role                Role    `json:"role"`
	Namespace           string  `json:"namespace"`
	ModelKey            *string `json:"model_key"`
	TransferBatchSize   int64   `json:"transfer_batch_size"`
	// StageThroughHost as written; EffectiveStageThroughHost applies the role's override.
	StageThroughHost bool `json:"stage_through_host"`

	SoftPinTTLMs       *int64   `json:"soft_pin_ttl_ms,omitempty"`
	GroupBlocks        *bool    `json:"group_blocks,omitempty"`
	StatsInterval      *float64 `json:"stats_interval,omitempty"` // seconds
	StagingBufferBytes *int64   `json:"staging_buffer_bytes,omitempty"`
	AsyncLoad          *bool    `json:"async_load,omitempty"`
	AsyncLoadWorkers   *int64   `json:"async_load_workers,omitempty"`
}

// DefaultClientConfig returns the values a client config takes for every key it leaves out.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{
		MetadataServer:    DefaultMetadataServer,
		Protocol:          DefaultProtocol,
		GlobalSegmentSize: DefaultGlobalSegmentSize,
		LocalBufferSize:   DefaultLocalBufferSize,
		Role:              RoleBoth,
		Namespace:         DefaultNamespace,
		TransferBatchSize: DefaultTransferBatchSize,
		StageThroughHost:  true,
	}
}

// EffectiveStageThroughHost is true whenever the role transfers: zero-copy registration is not
// available, so TensorRT-LLM forces staging back on.
func (c ClientConfig) EffectiveStageThroughHost() bool {
	return c.StageThroughHost || c.Role.Transfers()
}

// EffectiveStagingBufferBytes is the pinned host memory per transfer direction.
func (c ClientConfig) EffectiveStagingBufferBytes() int64 {
	if c.StagingBufferBytes != nil {
		return *c.StagingBufferBytes
	}
	return DefaultStagingBufferBytes
}

// Validate checks the value rules of a client config built in code. Diagnostics carry key
// paths but no file positions; Load reports the same rules with positions.
func (c ClientConfig) Validate() Diagnostics {
	d := newDec("")
	c.validate(d)
	return d.diags
}

// Keys Mooncake's own client reads from the same file; TensorRT-LLM ignores them.
var mooncakeOnlyClientKeys = map[string]bool{"enable_ssd_offload": true, "ssd_offload_path": true,
	"enable_client_http_server": true, "client_http_port": true}

func decodeClient(d *dec, root *node) *ClientConfig {
	c := DefaultClientConfig()
	o := d.object(root, "")
	o.str("master_server_address", &c.MasterServerAddress, false)
	if o.str("metadata_server", &c.MetadataServer, true) && c.MetadataServer == "" {
		c.MetadataServer = DefaultMetadataServer
	}
	o.str("protocol", &c.Protocol, false)
	o.str("device_name", &c.DeviceName, false)
	var seg, buf *Size
	o.sizePtr("global_segment_size", &seg, true, -1<<63)
	if seg != nil {
		c.GlobalSegmentSize = seg.Bytes
	}
	o.sizePtr("local_buffer_size", &buf, true, -1<<63)
	if buf != nil {
		c.LocalBufferSize = buf.Bytes
	}
	o.strPtr("local_hostname", &c.LocalHostname)
	if c.LocalHostname != nil && *c.LocalHostname == "" {
		c.LocalHostname = nil
	}
	o.strPtr("tenant_id", &c.TenantID)
	if c.TenantID != nil && *c.TenantID == "" {
		c.TenantID = nil
	}
	var role *Role
	o.role("role", &role)
	if role != nil {
		c.Role = *role
	}
	o.str("namespace", &c.Namespace, false)
	o.strPtr("model_key", &c.ModelKey)
	if c.ModelKey != nil && *c.ModelKey == "" {
		c.ModelKey = nil
	}
	if v, _, ok := o.intv("transfer_batch_size", intPython); ok {
		c.TransferBatchSize = v
	}
	if b, ok := o.boolv("stage_through_host", boolTruthy); ok {
		c.StageThroughHost = b
	}
	o.intPtr("soft_pin_ttl_ms", &c.SoftPinTTLMs, -1<<63)
	o.boolPtr("group_blocks", &c.GroupBlocks, boolStrict)
	o.floatPtr("stats_interval", &c.StatsInterval, false)
	var staging *Size
	o.sizePtr("staging_buffer_bytes", &staging, true, -1<<63)
	if staging != nil {
		c.StagingBufferBytes = &staging.Bytes
	}
	o.boolPtr("async_load", &c.AsyncLoad, boolStrict)
	o.intPtr("async_load_workers", &c.AsyncLoadWorkers, -1<<63)

	for k := range mooncakeOnlyClientKeys {
		o.used[k] = true
	}
	if o.present("cache_prefix") {
		o.field("cache_prefix")
		d.at(SeverityWarning, "cache_prefix", "cache_prefix is the old name and is not read", "write namespace")
	}
	o.rest(SeverityWarning, "; it is ignored")
	c.validate(d)
	return &c
}

func (c ClientConfig) validate(d *dec) {
	if c.MasterServerAddress == "" {
		d.at(SeverityError, "master_server_address", "master_server_address is required",
			"name the Mooncake master as host:port")
	}
	if c.GlobalSegmentSize < 0 {
		d.at(SeverityError, "global_segment_size", fmt.Sprintf("must be at least 0, found %d", c.GlobalSegmentSize), "")
	}
	if c.LocalBufferSize <= 0 {
		d.at(SeverityError, "local_buffer_size", fmt.Sprintf("must be greater than 0, found %d", c.LocalBufferSize), "")
	}
	if c.ModelKey == nil {
		d.at(SeverityError, "model_key", "model_key is required: every rank resolves it at startup and has no default",
			"name the model, for example its served name and revision")
	}
	checkProtocol(d, "protocol", c.Protocol)
	if c.TransferBatchSize <= 0 {
		d.at(SeverityError, "transfer_batch_size", fmt.Sprintf("must be greater than 0, found %d", c.TransferBatchSize), "")
	}
	if !c.StageThroughHost && c.Role.Transfers() {
		d.at(SeverityWarning, "stage_through_host",
			"stage_through_host is forced back to true for role "+string(c.Role)+": zero-copy registration is not available",
			"leave it out or set it to true")
	}
	checkSoftPin(d, "soft_pin_ttl_ms", c.SoftPinTTLMs)
	checkStatsInterval(d, "stats_interval", c.StatsInterval)
	if c.StagingBufferBytes != nil && *c.StagingBufferBytes <= 0 {
		d.at(SeverityError, "staging_buffer_bytes", fmt.Sprintf("must be greater than 0, found %d", *c.StagingBufferBytes), "")
	}
	if c.AsyncLoadWorkers != nil && *c.AsyncLoadWorkers < 1 {
		d.at(SeverityError, "async_load_workers", fmt.Sprintf("must be at least 1, found %d", *c.AsyncLoadWorkers), "")
	}
}

func checkSoftPin(d *dec, path string, ttl *int64) {
	if ttl == nil {
		return
	}
	switch {
	case *ttl <= 0:
		d.at(SeverityError, path, fmt.Sprintf("must be greater than 0, found %d", *ttl), "leave it out to turn soft pins off")
	case *ttl > MaxSoftPinTTLMs:
		d.at(SeverityWarning, path,
			fmt.Sprintf("%d ms is above the master's default ceiling of %d ms (24 h): such a master refuses every put", *ttl, MaxSoftPinTTLMs),
			"lower it to 86400000 or less, or start the master with a larger --max_kv_soft_pin_ttl")
	}
}

func checkStatsInterval(d *dec, path string, v *float64) {
	if v != nil && !(*v > 0 && *v <= maxFinite) {
		d.at(SeverityError, path, "must be a finite number greater than 0, found "+formatPyFloat(*v),
			"leave it out to turn stats off")
	}
}

const maxFinite = 1.7976931348623157e308
