package config

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ParsePoolRef splits a mooncake_store pool value: "file://<path>" names a manifest, anything
// else must be a bare host:port naming the master.
func ParsePoolRef(pool string) (manifestPath, masterAddress string, err error) {
	if rest, ok := strings.CutPrefix(pool, "file://"); ok {
		if rest == "" {
			return "", "", fmt.Errorf("pool %q names no manifest path", pool)
		}
		return rest, "", nil
	}
	if strings.Contains(pool, "://") {
		return "", "", fmt.Errorf("pool %q: only file:// manifests and bare host:port addresses are understood", pool)
	}
	i := strings.LastIndex(pool, ":")
	if i <= 0 || i == len(pool)-1 {
		return "", "", fmt.Errorf("pool %q is neither file://<manifest> nor host:port", pool)
	}
	if p, err := strconv.Atoi(pool[i+1:]); err != nil || p < 1 || p > 65535 {
		return "", "", fmt.Errorf("pool %q: port %q is not a number between 1 and 65535", pool, pool[i+1:])
	}
	return "", pool, nil
}

// RenderClientConfig builds the client config a server renders from its mooncake_store block
// and the pool manifest, and its bytes exactly as TensorRT-LLM writes them: json.dump with
// indent 2, keys in insertion order, no trailing newline. Keys: master_server_address,
// metadata_server, protocol (manifest); namespace (block, else manifest); device_name;
// model_key; global_segment_size; local_buffer_size (always 1 GiB); role;
// transfer_batch_size; stage_through_host; then, only when the block sets them,
// local_hostname and the seed's soft_pin_ttl_ms, group_blocks, stats_interval,
// staging_buffer_bytes, async_load, async_load_workers.
//
// manifest may be nil when the block's pool is a bare host:port; it then takes the manifest
// defaults. detectDevice is called only for the rdma protocol and may be nil (no device).
func RenderClientConfig(block *MooncakeStoreBlock, manifest *PoolManifest, detectDevice func() string) (ClientConfig, []byte, error) {
	if block == nil {
		return ClientConfig{}, nil, fmt.Errorf("%w: no mooncake_store block", ErrRender)
	}
	if manifest == nil {
		path, addr, err := ParsePoolRef(block.Pool)
		if err != nil {
			return ClientConfig{}, nil, fmt.Errorf("%w: %w", ErrRender, err)
		}
		if path != "" {
			return ClientConfig{}, nil, fmt.Errorf("%w: pool %s names a manifest; load it and pass it in", ErrRender, block.Pool)
		}
		m := DefaultPoolManifest(addr)
		manifest = &m
	}
	if manifest.MasterServerAddress == "" {
		return ClientConfig{}, nil, fmt.Errorf("%w: the manifest has no master_server_address", ErrRender)
	}
	c := ClientConfig{
		MasterServerAddress: manifest.MasterServerAddress,
		MetadataServer:      manifest.MetadataServer,
		Protocol:            manifest.Protocol,
		Namespace:           manifest.Namespace,
		GlobalSegmentSize:   block.EffectiveSegmentSize(),
		LocalBufferSize:     DefaultLocalBufferSize,
		Role:                block.EffectiveRole(),
		ModelKey:            block.ModelKey,
		TransferBatchSize:   DefaultTransferBatchSize,
		StageThroughHost:    true,
		LocalHostname:       block.LocalHostname,
		SoftPinTTLMs:        block.SoftPinTTLMs,
		GroupBlocks:         block.GroupBlocks,
		StatsInterval:       block.StatsInterval,
		AsyncLoad:           block.AsyncLoad,
		AsyncLoadWorkers:    block.AsyncLoadWorkers,
	}
	if c.MetadataServer == "" {
		c.MetadataServer = DefaultMetadataServer
	}
	if block.Namespace != nil {
		c.Namespace = *block.Namespace
	}
	if block.TransferBatchSize != nil {
		c.TransferBatchSize = *block.TransferBatchSize
	}
	if block.StageThroughHost != nil {
		c.StageThroughHost = *block.StageThroughHost
	}
	if block.StagingBufferBytes != nil {
		v := block.StagingBufferBytes.Bytes
		c.StagingBufferBytes = &v
	}
	if block.SegmentSize != nil && block.SegmentSize.Text != "" {
		if _, err := ParseSize(block.SegmentSize.Text, true); err != nil {
			return ClientConfig{}, nil, fmt.Errorf("%w: segment_size: %w", ErrRender, err)
		}
	}
	if c.Protocol == "rdma" && detectDevice != nil {
		c.DeviceName = detectDevice()
	}
	return c, MarshalClientConfig(c), nil
}

// MarshalClientConfig writes a client config in the rendered key order (see
// RenderClientConfig), followed by tenant_id when set. Optional keys that are nil are left
// out, except model_key, which is written as null.
func MarshalClientConfig(c ClientConfig) []byte {
	var model any
	if c.ModelKey != nil {
		model = *c.ModelKey
	}
	e := []kv{
		{"master_server_address", c.MasterServerAddress},
		{"metadata_server", c.MetadataServer},
		{"protocol", c.Protocol},
		{"namespace", c.Namespace},
		{"device_name", c.DeviceName},
		{"model_key", model},
		{"global_segment_size", c.GlobalSegmentSize},
		{"local_buffer_size", c.LocalBufferSize},
		{"role", string(c.Role)},
		{"transfer_batch_size", c.TransferBatchSize},
		{"stage_through_host", c.StageThroughHost},
	}
	if c.LocalHostname != nil {
		e = append(e, kv{"local_hostname", *c.LocalHostname})
	}
	if c.TenantID != nil {
		e = append(e, kv{"tenant_id", *c.TenantID})
	}
	if c.SoftPinTTLMs != nil {
		e = append(e, kv{"soft_pin_ttl_ms", *c.SoftPinTTLMs})
	}
	if c.GroupBlocks != nil {
		e = append(e, kv{"group_blocks", *c.GroupBlocks})
	}
	if c.StatsInterval != nil {
		e = append(e, kv{"stats_interval", *c.StatsInterval})
	}
	if c.StagingBufferBytes != nil {
		e = append(e, kv{"staging_buffer_bytes", *c.StagingBufferBytes})
	}
	if c.AsyncLoad != nil {
		e = append(e, kv{"async_load", *c.AsyncLoad})
	}
	if c.AsyncLoadWorkers != nil {
		e = append(e, kv{"async_load_workers", *c.AsyncLoadWorkers})
	}
	var w pyJSON
	w.object(e, 0)
	return w.b.Bytes()
}

// WriteFileAtomic writes data to path through the temporary file {path}.partial.{pid} and a
// rename, so a reader sees either the old file or the whole new one.
func WriteFileAtomic(path string, data []byte) error {
	tmp := fmt.Sprintf("%s.partial.%d", path, os.Getpid())
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// DetectRDMADevices lists the InfiniBand devices under sysfsRoot (normally
// /sys/class/infiniband) whose port 1 is InfiniBand, ACTIVE and at the highest rate found,
// sorted and joined with ",", as the renderer picks device_name. It returns "" when none is.
func DetectRDMADevices(sysfsRoot string) string {
	ents, err := os.ReadDir(sysfsRoot)
	if err != nil {
		return ""
	}
	best := -1
	var names []string
	for _, e := range ents {
		port := filepath.Join(sysfsRoot, e.Name(), "ports", "1")
		ll, err1 := os.ReadFile(filepath.Join(port, "link_layer"))
		st, err2 := os.ReadFile(filepath.Join(port, "state"))
		rt, err3 := os.ReadFile(filepath.Join(port, "rate"))
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		if strings.TrimSpace(string(ll)) != "InfiniBand" || !strings.Contains(string(st), "ACTIVE") {
			continue
		}
		fields := strings.Fields(string(rt))
		if len(fields) == 0 {
			continue
		}
		rate, err := strconv.Atoi(fields[0])
		if err != nil {
			continue
		}
		switch {
		case rate > best:
			best, names = rate, []string{e.Name()}
		case rate == best:
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// Override is one block field that an inherited client config replaced.
type Override struct {
	Path     string `json:"path"` // key path in the YAML, kv_connector_config.mooncake_store.<field>
	From     string `json:"from"` // the block's value ("" when it was left out)
	To       string `json:"to"`   // the client config's value ("off" for a dropped setting)
	Explicit bool   `json:"explicit"`
}

// Restate overwrites the block's fields with the effective values of an inherited client
// config, as TensorRT-LLM does when MOONCAKE_CONFIG_PATH is set: role, segment_size (in
// bytes), namespace, model_key, transfer_batch_size, stage_through_host and the seed's six
// fields. A client config without a TTL or stats interval turns them off; the other seed fields
// it leaves out return to their defaults (left nil on the block). pool,
// local_hostname, run_dir and master_timeout are never touched. It returns every field whose
// value changed; Explicit marks those the deployment wrote in the block, which are the ones
// TensorRT-LLM reports.
func Restate(block *MooncakeStoreBlock, client ClientConfig) []Override {
	var out []Override
	note := func(field string, set bool, from, to string) {
		if from != to {
			out = append(out, Override{Path: pStoreF + field, From: from, To: to, Explicit: set})
		}
	}
	note("role", block.Role != nil, string(block.EffectiveRole()), string(client.Role))
	r := client.Role
	block.Role = &r

	note("segment_size", block.SegmentSize != nil, strconv.FormatInt(block.EffectiveSegmentSize(), 10),
		strconv.FormatInt(client.GlobalSegmentSize, 10))
	block.SegmentSize = &Size{Bytes: client.GlobalSegmentSize}

	from := ""
	if block.Namespace != nil {
		from = *block.Namespace
	}
	note("namespace", block.Namespace != nil, from, client.Namespace)
	ns := client.Namespace
	block.Namespace = &ns

	note("model_key", block.ModelKey != nil, strOr(block.ModelKey, ""), strOr(client.ModelKey, ""))
	block.ModelKey = client.ModelKey

	note("transfer_batch_size", block.TransferBatchSize != nil,
		strconv.FormatInt(int64Or(block.TransferBatchSize, DefaultTransferBatchSize), 10),
		strconv.FormatInt(client.TransferBatchSize, 10))
	tbs := client.TransferBatchSize
	block.TransferBatchSize = &tbs

	note("stage_through_host", block.StageThroughHost != nil,
		strconv.FormatBool(boolOr(block.StageThroughHost, true)), strconv.FormatBool(client.StageThroughHost))
	sth := client.StageThroughHost
	block.StageThroughHost = &sth

	note("soft_pin_ttl_ms", block.SoftPinTTLMs != nil, optInt(block.SoftPinTTLMs), optInt(client.SoftPinTTLMs))
	block.SoftPinTTLMs = client.SoftPinTTLMs

	note("group_blocks", block.GroupBlocks != nil, strconv.FormatBool(boolOr(block.GroupBlocks, false)),
		strconv.FormatBool(boolOr(client.GroupBlocks, false)))
	block.GroupBlocks = client.GroupBlocks

	note("stats_interval", block.StatsInterval != nil, optFloat(block.StatsInterval), optFloat(client.StatsInterval))
	block.StatsInterval = client.StatsInterval

	var blockStaging *int64
	if block.StagingBufferBytes != nil {
		blockStaging = &block.StagingBufferBytes.Bytes
	}
	note("staging_buffer_bytes", blockStaging != nil,
		strconv.FormatInt(int64Or(blockStaging, DefaultStagingBufferBytes), 10),
		strconv.FormatInt(client.EffectiveStagingBufferBytes(), 10))
	block.StagingBufferBytes = nil
	if client.StagingBufferBytes != nil {
		block.StagingBufferBytes = &Size{Bytes: *client.StagingBufferBytes}
	}

	note("async_load", block.AsyncLoad != nil, strconv.FormatBool(boolOr(block.AsyncLoad, false)),
		strconv.FormatBool(boolOr(client.AsyncLoad, false)))
	block.AsyncLoad = client.AsyncLoad

	note("async_load_workers", block.AsyncLoadWorkers != nil,
		strconv.FormatInt(int64Or(block.AsyncLoadWorkers, DefaultAsyncLoadWorkers), 10),
		strconv.FormatInt(int64Or(client.AsyncLoadWorkers, DefaultAsyncLoadWorkers), 10))
	block.AsyncLoadWorkers = client.AsyncLoadWorkers
	return out
}

func strOr(p *string, def string) string {
	if p != nil {
		return *p
	}
	return def
}

func int64Or(p *int64, def int64) int64 {
	if p != nil {
		return *p
	}
	return def
}

func boolOr(p *bool, def bool) bool {
	if p != nil {
		return *p
	}
	return def
}

func optInt(p *int64) string {
	if p == nil {
		return "off"
	}
	return strconv.FormatInt(*p, 10)
}

func optFloat(p *float64) string {
	if p == nil {
		return "off"
	}
	return formatPyFloat(*p)
}
