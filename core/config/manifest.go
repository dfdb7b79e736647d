package config

import "fmt"

// Defaults of the pool manifest (pool.json, published by `trtllm-serve mooncake_master --pool_file`,
// TensorRT-LLM's mooncake_store/master.py, https://github.com/NVIDIA/TensorRT-LLM/pull/21195) and of the master that publishes it.
const (
	DefaultRPCPort       = 50051
	DefaultMetricsPort   = 9004
	DefaultEvictionRatio = 0.05
	DefaultMasterTimeout = 60.0 // seconds
)

// PoolManifest is pool.json, published by the pool's master for servers to find it. Keys this
// package does not know are kept in Extra (plain Go values: map[string]any, []any, string,
// int64, float64, bool, nil) and written back by Marshal.
type PoolManifest struct {
	MasterServerAddress string         `json:"master_server_address"`
	MetadataServer      string         `json:"metadata_server"`
	Protocol            string         `json:"protocol"`
	Namespace           string         `json:"namespace"`
	MetricsPort         *int64         `json:"metrics_port,omitempty"`
	EvictionRatio       *float64       `json:"eviction_ratio,omitempty"`
	Extra               map[string]any `json:"extra,omitempty"`
}

// DefaultPoolManifest returns the manifest a bare host:port pool address stands for.
func DefaultPoolManifest(masterAddress string) PoolManifest {
	return PoolManifest{MasterServerAddress: masterAddress, MetadataServer: DefaultMetadataServer,
		Protocol: DefaultProtocol, Namespace: DefaultNamespace}
}

// Marshal writes the manifest as the master does: indent 2, keys sorted, a final newline.
func (m PoolManifest) Marshal() []byte {
	entries := []kv{{"master_server_address", m.MasterServerAddress}, {"metadata_server", m.MetadataServer},
		{"protocol", m.Protocol}, {"namespace", m.Namespace}}
	if m.MetricsPort != nil {
		entries = append(entries, kv{"metrics_port", *m.MetricsPort})
	}
	if m.EvictionRatio != nil {
		entries = append(entries, kv{"eviction_ratio", *m.EvictionRatio})
	}
	for k, v := range m.Extra {
		entries = append(entries, kv{k, v})
	}
	w := pyJSON{sortKeys: true}
	w.object(entries, 0)
	w.b.WriteByte('\n')
	return w.b.Bytes()
}

// Validate checks the value rules of a manifest built in code.
func (m PoolManifest) Validate() Diagnostics {
	d := newDec("")
	m.validate(d)
	return d.diags
}

var manifestKeys = map[string]bool{"master_server_address": true, "metadata_server": true,
	"protocol": true, "namespace": true, "metrics_port": true, "eviction_ratio": true}

func decodeManifest(d *dec, root *node) *PoolManifest {
	m := DefaultPoolManifest("")
	o := d.object(root, "")
	o.str("master_server_address", &m.MasterServerAddress, false)
	if o.str("metadata_server", &m.MetadataServer, true) && m.MetadataServer == "" {
		m.MetadataServer = DefaultMetadataServer
	}
	o.str("protocol", &m.Protocol, false)
	o.str("namespace", &m.Namespace, false)
	o.intPtr("metrics_port", &m.MetricsPort, -1<<63)
	o.floatPtr("eviction_ratio", &m.EvictionRatio, false)
	if o.n != nil {
		for i, k := range o.n.keys {
			if !manifestKeys[k.text] {
				if m.Extra == nil {
					m.Extra = map[string]any{}
				}
				m.Extra[k.text] = treeValue(o.n.vals[i])
			}
		}
	}
	m.validate(d)
	return &m
}

var knownProtocols = map[string]bool{"tcp": true, "rdma": true, "efa": true, "nvmeof": true,
	"nvlink": true, "musa": true, "nvlink_intra": true, "hip": true, "barex": true, "cxl": true,
	"ascend": true, "ub": true, "ubshmem": true, "maca": true, "sunrise_link": true, "rpc_only": true}

func (m PoolManifest) validate(d *dec) {
	if m.MasterServerAddress == "" {
		d.at(SeverityError, "master_server_address", "master_server_address is required",
			"the master writes it as host:port")
	}
	checkProtocol(d, "protocol", m.Protocol)
	if m.MetricsPort != nil && (*m.MetricsPort < 1 || *m.MetricsPort > 65535) {
		d.at(SeverityError, "metrics_port", fmt.Sprintf("must be a port between 1 and 65535, found %d", *m.MetricsPort), "")
	}
	if m.EvictionRatio != nil && !(*m.EvictionRatio >= 0 && *m.EvictionRatio <= 1) {
		d.at(SeverityError, "eviction_ratio", "must be between 0 and 1, found "+formatPyFloat(*m.EvictionRatio), "")
	}
}

func checkProtocol(d *dec, path, p string) {
	if !knownProtocols[p] {
		d.at(SeverityWarning, path, fmt.Sprintf("protocol %q is not one Mooncake knows", p),
			"use rdma or tcp")
	}
}
