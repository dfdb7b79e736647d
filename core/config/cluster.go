package config

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"
)

// ClusterKeys are the serve keys of the mooncake backend, which joins `kvctl serve` to a
// Mooncake cluster. Each has a counterpart in mooncake.json (named in its doc), so an existing
// TensorRT-LLM client config can be read unchanged through MooncakeConfig; a key set here wins
// over the file.
type ClusterKeys struct {
	// Master is the master's RPC address, host:port (master_server_address).
	Master string `json:"master,omitempty" yaml:"master,omitempty"`
	// Metadata is the HTTP metadata server's URL (metadata_server).
	Metadata string `json:"metadata,omitempty" yaml:"metadata,omitempty"`
	// HostAddress is the address peers reach this host's segment at (local_hostname); empty
	// picks the local address of the route to the master.
	HostAddress string `json:"host-address,omitempty" yaml:"host-address,omitempty"`
	// LocalBufferSize is the client's transfer buffer (local_buffer_size).
	LocalBufferSize string `json:"local-buffer-size,omitempty" yaml:"local-buffer-size,omitempty"`
	// Protocol is the transfer protocol (protocol); only tcp is spoken.
	Protocol string `json:"protocol,omitempty" yaml:"protocol,omitempty"`
	// DeviceName is the RDMA device list (device_name); unused by tcp.
	DeviceName string `json:"device-name,omitempty" yaml:"device-name,omitempty"`
	// MooncakeConfig is the path of a mooncake.json client config to take the keys above from.
	MooncakeConfig string `json:"mooncake-config,omitempty" yaml:"mooncake-config,omitempty"`
	// PoolTimeout bounds every pool call an engine waits for; 0 takes the daemon's default.
	PoolTimeout time.Duration `json:"pool-timeout,omitempty" yaml:"pool-timeout,omitempty"`
	// MasterAdmin is the master's HTTP admin server, where the cluster's segments and
	// capacity are read; empty takes http://MASTER-HOST:9003 (mooncake_master --metrics_port).
	MasterAdmin string `json:"master-admin,omitempty" yaml:"master-admin,omitempty"`
	// TransferPort is the TCP port this host serves its segment on (the Transfer Engine);
	// 0 picks a free port. Peers connect to it: a firewall must let them.
	TransferPort int `json:"transfer-port,omitempty" yaml:"transfer-port,omitempty"`
	// ObjectChecksum fills Mooncake's per-object checksum (CRC-64) on every put and verifies it
	// on every get, refusing a page changed in its segment after it was put (Mooncake's own
	// client does the same with MOONCAKE_STORE_CHECKSUM=1). Off by default: it costs a pass
	// over every page saved and loaded (docs/PERFORMANCE.md).
	ObjectChecksum bool `json:"object-checksum,omitempty" yaml:"object-checksum,omitempty"`
	// LocateWindow is how long the replica lists a lookup fetched serve the load that follows
	// without asking the master again (never past half the master's read lease), and in its
	// first half answer lookups of the same pages; 0 takes the default (1s) and a negative
	// window turns it off, every lookup and load asking the master.
	LocateWindow time.Duration `json:"locate-window,omitempty" yaml:"locate-window,omitempty"`
}

// Serve keys of the mooncake backend, which are also flag names of `kvctl serve`.
const (
	ServeKeyMaster          = "master"
	ServeKeyMetadata        = "metadata"
	ServeKeyHostAddress     = "host-address"
	ServeKeyLocalBufferSize = "local-buffer-size"
	ServeKeyProtocol        = "protocol"
	ServeKeyDeviceName      = "device-name"
	ServeKeyMooncakeConfig  = "mooncake-config"
	ServeKeyPoolTimeout     = "pool-timeout"
	ServeKeyMasterAdmin     = "master-admin"
	ServeKeyTransferPort    = "transfer-port"
	ServeKeyObjectChecksum  = "object-checksum"
	ServeKeyLocateWindow    = "locate-window"
)

// MaxLocateWindow bounds locate-window. The master's read lease (10 s by default) caps a window
// at half of it anyway.
const MaxLocateWindow = time.Minute

// DefaultMasterAdminPort is mooncake_master's --metrics_port default, where its HTTP admin
// server answers.
const DefaultMasterAdminPort = "9003"

// ProtocolTCP is the one transfer protocol kvctl's Mooncake client speaks.
const ProtocolTCP = "tcp"

// DefaultClusterLocalBufferSize is the transfer buffer a kvctl host reports when neither a key
// nor mooncake.json sets one.
const DefaultClusterLocalBufferSize = 16 << 20

func (k ClusterKeys) set() []string {
	var out []string
	for _, kv := range []struct{ key, v string }{{ServeKeyMaster, k.Master}, {ServeKeyMetadata, k.Metadata},
		{ServeKeyHostAddress, k.HostAddress}, {ServeKeyLocalBufferSize, k.LocalBufferSize}, {ServeKeyProtocol, k.Protocol},
		{ServeKeyDeviceName, k.DeviceName}, {ServeKeyMooncakeConfig, k.MooncakeConfig}, {ServeKeyMasterAdmin, k.MasterAdmin}} {
		if kv.v != "" {
			out = append(out, kv.key)
		}
	}
	if k.ObjectChecksum {
		out = append(out, ServeKeyObjectChecksum)
	}
	if k.LocateWindow != 0 {
		out = append(out, ServeKeyLocateWindow)
	}
	return out
}

// warnUnused flags cluster keys given to the embedded backend.
func (k ClusterKeys) warnUnused(d *dec) {
	for _, key := range k.set() {
		d.at(SeverityWarning, key, key+" is read only by the mooncake backend", "add pool-backend: mooncake to join a Mooncake cluster")
	}
}

// validateCluster checks the mooncake backend's keys as given, without reading any file.
func (s ServeConfig) validateCluster(d *dec) {
	k := s.ClusterKeys
	if k.Master == "" && k.MooncakeConfig == "" && s.Pool == "" {
		d.at(SeverityError, ServeKeyMaster, "the mooncake backend needs the master's address",
			"give master: HOST:PORT (the master's --rpc_port, 50051 by default), or mooncake-config: a mooncake.json")
	}
	if k.Master != "" {
		if err := checkHostPort(k.Master); err != nil {
			d.at(SeverityError, ServeKeyMaster, err.Error(), "for example 10.0.0.1:50051")
		}
	}
	if k.Metadata != "" {
		if err := checkMetadataURL(k.Metadata); err != nil {
			d.at(SeverityError, ServeKeyMetadata, err.Error(), metadataHint)
		}
	}
	if k.HostAddress != "" {
		if err := checkHost(k.HostAddress); err != nil {
			d.at(SeverityError, ServeKeyHostAddress, err.Error(), "an IP address or host name peers can reach, without a port")
		}
	}
	if k.LocalBufferSize != "" {
		if _, err := ParseSize(k.LocalBufferSize, true); err != nil {
			d.at(SeverityError, ServeKeyLocalBufferSize, err.Error(), "for example 16MiB")
		}
	}
	if k.Protocol != "" {
		if err := checkClusterProtocol(k.Protocol); err != nil {
			d.at(SeverityError, ServeKeyProtocol, err.Error(), "use tcp")
		}
	}
	if k.PoolTimeout < 0 {
		d.at(SeverityError, ServeKeyPoolTimeout, "must not be negative", "for example 5s")
	}
	if k.MasterAdmin != "" {
		if u, err := url.Parse(k.MasterAdmin); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			d.at(SeverityError, ServeKeyMasterAdmin, fmt.Sprintf("%q is not an http:// URL", k.MasterAdmin), "for example http://10.0.0.5:9003")
		}
	}
	if k.TransferPort < 0 || k.TransferPort > 65535 {
		d.at(SeverityError, ServeKeyTransferPort, fmt.Sprintf("port %d is not between 0 and 65535", k.TransferPort), "0 picks a free port")
	}
	if k.LocateWindow > MaxLocateWindow {
		d.at(SeverityError, ServeKeyLocateWindow, fmt.Sprintf("%s is above the %s limit", k.LocateWindow, MaxLocateWindow),
			"the master's read lease (10s by default) caps it at half of it; for example 1s, or -1s to turn it off")
	}
}

const metadataHint = "give the master's HTTP metadata server, e.g. http://10.0.0.1:8080/metadata (mooncake_master --enable_http_metadata_server)"

func checkHostPort(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("%q is not host:port", v)
	}
	if err := checkPort(port); err != nil {
		return fmt.Errorf("%q: %w", v, err)
	}
	return nil
}

func checkPort(p string) error {
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' || n > 65535 {
			return fmt.Errorf("port %q is not a number between 1 and 65535", p)
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number between 1 and 65535", p)
	}
	return nil
}

func checkHost(v string) error {
	if strings.ContainsAny(v, ":/ \t") && net.ParseIP(v) == nil {
		return fmt.Errorf("%q is not an IP address or host name", v)
	}
	return nil
}

func checkMetadataURL(v string) error {
	if v == "P2PHANDSHAKE" {
		return errors.New("P2PHANDSHAKE metadata is not supported: kvctl publishes and finds segments on an HTTP metadata server")
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http:// URL", v)
	}
	return nil
}

func checkClusterProtocol(v string) error {
	if v != ProtocolTCP {
		return fmt.Errorf("protocol %q is not supported: kvctl's Mooncake client speaks tcp (every host of the cluster must use tcp)", v)
	}
	return nil
}

// Cluster is the mooncake backend's effective settings, after merging the serve keys, the
// mooncake.json they name and the pool manifest.
type Cluster struct {
	Master           string
	Metadata         string
	HostAddress      string // "" when it is to be found from the route to the master
	Protocol         string
	DeviceName       string
	SegmentBytes     int64 // 0 when it is to be sized automatically
	LocalBufferBytes int64
	MasterAdmin      string
	// MasterAdminDerived is set when MasterAdmin was not given but derived from the master's
	// host and mooncake_master's default admin port (the master does not report its admin
	// port over RPC).
	MasterAdminDerived bool
	TransferPort       int
	// Sources names where each setting came from, by serve key: "flag or config", a file's
	// path, or "default".
	Sources map[string]string
}

// ResolveCluster merges the mooncake backend's settings: a key of s wins, then the
// mooncake.json named by mooncake-config, then the pool manifest named by pool (or pool's
// host:port as the master), then the defaults. read reads those files (os.ReadFile when nil).
// Every problem is returned at once; the files' own problems carry their positions.
func (s ServeConfig) ResolveCluster(read func(string) ([]byte, error)) (Cluster, Diagnostics) {
	if read == nil {
		read = os.ReadFile
	}
	r := clusterResolver{s: s, read: read, d: newDec(""), c: Cluster{Sources: map[string]string{}}}
	r.readClient()
	r.readManifest()
	r.pickAddresses()
	r.pickSizes()
	r.pickAdmin()
	r.check()
	return r.c, r.d.diags
}

// clusterResolver is one ResolveCluster call: the serve keys, the files they name as read, the
// settings merged so far (c, with where each came from) and the problems found (d).
type clusterResolver struct {
	s    ServeConfig
	read func(string) ([]byte, error)
	d    *dec
	c    Cluster

	client       *ClientConfig // the mooncake.json named by mooncake-config, when it was read
	manifest     *PoolManifest // the pool manifest named by pool, when it was read
	manifestPath string
	poolMaster   string // pool's master, when pool is host:port
}

// readClient reads the mooncake.json named by mooncake-config, if any.
func (r *clusterResolver) readClient() {
	p := r.s.MooncakeConfig
	if p == "" {
		return
	}
	data, err := r.read(p)
	if err != nil {
		r.d.at(SeverityError, ServeKeyMooncakeConfig, fmt.Sprintf("cannot read %s: %v", p, err), "")
		return
	}
	f, fd := Load(p, data, LoadOptions{Kind: KindClient})
	// The engines' keys (model_key, role, ...) are for the engines to check; serve
	// reports what it reads, and anything that kept the file from parsing.
	for _, x := range fd {
		if x.Path == "" || clusterClientKeys[x.Path] {
			r.d.diags = append(r.d.diags, x)
		}
	}
	if f != nil {
		r.client = f.Client
	}
}

// readManifest reads the pool manifest named by pool, if any, or takes pool's host:port as
// the master.
func (r *clusterResolver) readManifest() {
	if r.s.Pool == "" {
		return
	}
	mp, pm, err := ParsePoolRef(r.s.Pool)
	if err != nil {
		r.d.at(SeverityError, ServeKeyPool, err.Error(), "")
	}
	r.manifestPath, r.poolMaster = mp, pm
	if mp == "" {
		return
	}
	data, err := r.read(mp)
	if err != nil {
		r.d.at(SeverityError, ServeKeyPool, fmt.Sprintf("cannot read the pool manifest %s: %v", mp, err), "")
		return
	}
	f, fd := Load(mp, data, LoadOptions{Kind: KindManifest})
	r.d.diags = append(r.d.diags, fd...)
	if f != nil {
		r.manifest = f.Manifest
	}
}

// pick returns the setting of key: flag when set, else the mooncake.json's value (fromClient),
// else the manifest's (fromManifest), else def; a nil fromClient or fromManifest means the
// file has no such setting. It records where the setting came from.
func (r *clusterResolver) pick(key, flag string, fromClient func(*ClientConfig) string, fromManifest func(*PoolManifest) string, def string) string {
	switch {
	case flag != "":
		r.c.Sources[key] = "flag or config"
		return flag
	case r.client != nil && fromClient != nil && fromClient(r.client) != "":
		r.c.Sources[key] = r.s.MooncakeConfig
		return fromClient(r.client)
	case r.manifest != nil && fromManifest != nil && fromManifest(r.manifest) != "":
		r.c.Sources[key] = r.manifestPath
		return fromManifest(r.manifest)
	}
	r.c.Sources[key] = "default"
	return def
}

// pickAddresses merges the master, the metadata server, the host address, the protocol and the
// device list.
func (r *clusterResolver) pickAddresses() {
	s, c := r.s, &r.c
	master := s.Master
	if master == "" && r.poolMaster != "" {
		master = r.poolMaster
	}
	c.Master = r.pick(ServeKeyMaster, master, func(cc *ClientConfig) string { return cc.MasterServerAddress },
		func(m *PoolManifest) string { return m.MasterServerAddress }, "")
	c.Metadata = r.pick(ServeKeyMetadata, s.Metadata, func(cc *ClientConfig) string { return cc.MetadataServer },
		func(m *PoolManifest) string { return m.MetadataServer }, "")
	c.HostAddress = r.pick(ServeKeyHostAddress, s.HostAddress, func(cc *ClientConfig) string {
		if cc.LocalHostname != nil {
			return *cc.LocalHostname
		}
		return ""
	}, nil, "")
	c.Protocol = r.pick(ServeKeyProtocol, s.Protocol, func(cc *ClientConfig) string { return cc.Protocol },
		func(m *PoolManifest) string { return m.Protocol }, ProtocolTCP)
	c.DeviceName = r.pick(ServeKeyDeviceName, s.DeviceName, func(cc *ClientConfig) string { return cc.DeviceName }, nil, "")
}

// pickSizes merges the segment's size and the transfer buffer's.
func (r *clusterResolver) pickSizes() {
	s, c := r.s, &r.c
	if n, ok, err := s.PoolSizeBytes(); err == nil && ok {
		c.SegmentBytes, c.Sources[ServeKeyPoolSize] = n, "flag or config"
	} else if r.client != nil {
		c.SegmentBytes, c.Sources[ServeKeyPoolSize] = r.client.GlobalSegmentSize, s.MooncakeConfig
	} else {
		c.Sources[ServeKeyPoolSize] = "default"
	}
	if s.LocalBufferSize != "" {
		if n, err := ParseSize(s.LocalBufferSize, true); err == nil {
			c.LocalBufferBytes, c.Sources[ServeKeyLocalBufferSize] = n, "flag or config"
		}
	} else if r.client != nil {
		c.LocalBufferBytes, c.Sources[ServeKeyLocalBufferSize] = r.client.LocalBufferSize, s.MooncakeConfig
	} else {
		c.LocalBufferBytes, c.Sources[ServeKeyLocalBufferSize] = DefaultClusterLocalBufferSize, "default"
	}
}

// pickAdmin takes the transfer port and the master's admin server, derived from the master's
// host when not given.
func (r *clusterResolver) pickAdmin() {
	c := &r.c
	c.TransferPort = r.s.TransferPort
	c.MasterAdmin = r.s.MasterAdmin
	if c.MasterAdmin == "" {
		if host, _, err := net.SplitHostPort(c.Master); err == nil && host != "" {
			c.MasterAdmin = "http://" + net.JoinHostPort(host, DefaultMasterAdminPort)
			c.MasterAdminDerived = true
		}
	}
}

// where names the file a setting came from, for a problem found in it: "" when it was a key
// or a default.
func (r *clusterResolver) where(key string) string {
	if src := r.c.Sources[key]; src != "flag or config" && src != "default" {
		return " (from " + src + ")"
	}
	return ""
}

// check reports the merged settings' problems.
func (r *clusterResolver) check() {
	c, d := &r.c, r.d
	if c.Master == "" {
		d.at(SeverityError, ServeKeyMaster, "the mooncake backend needs the master's address", "give master: HOST:PORT, or a mooncake.json with master_server_address")
	} else if err := checkHostPort(c.Master); err != nil {
		d.at(SeverityError, ServeKeyMaster, err.Error()+r.where(ServeKeyMaster), "")
	}
	if c.Metadata == "" {
		d.at(SeverityError, ServeKeyMetadata, "the mooncake backend needs the metadata server", metadataHint)
	} else if err := checkMetadataURL(c.Metadata); err != nil {
		d.at(SeverityError, ServeKeyMetadata, err.Error()+r.where(ServeKeyMetadata), metadataHint)
	}
	if err := checkClusterProtocol(c.Protocol); err != nil {
		d.at(SeverityError, ServeKeyProtocol, err.Error()+r.where(ServeKeyProtocol), "set protocol to tcp here and on every host")
	}
	if c.HostAddress != "" {
		if err := checkHost(c.HostAddress); err != nil {
			d.at(SeverityError, ServeKeyHostAddress, err.Error()+r.where(ServeKeyHostAddress), "")
		}
	}
	if c.SegmentBytes < 0 {
		d.at(SeverityError, ServeKeyPoolSize, fmt.Sprintf("segment size %d is negative%s", c.SegmentBytes, r.where(ServeKeyPoolSize)), "")
	}
	if c.LocalBufferBytes <= 0 {
		d.at(SeverityError, ServeKeyLocalBufferSize, fmt.Sprintf("must be greater than 0, found %d%s", c.LocalBufferBytes, r.where(ServeKeyLocalBufferSize)), "")
	}
}

// RouteAddress returns the local address of the route to master (host:port): the address a
// peer on that network reaches this host at. It sends nothing; ctx bounds the name lookup.
func RouteAddress(ctx context.Context, master string) (string, error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "udp", master)
	if err != nil {
		return "", fmt.Errorf("find the local address of the route to %s: %w", master, err)
	}
	defer conn.Close()
	ua, ok := conn.LocalAddr().(*net.UDPAddr)
	if !ok {
		return "", fmt.Errorf("find the local address of the route to %s: unexpected address %v", master, conn.LocalAddr())
	}
	return ua.IP.String(), nil
}

// clusterClientKeys are the mooncake.json keys serve reads.
var clusterClientKeys = map[string]bool{"master_server_address": true, "metadata_server": true, "local_hostname": true,
	"global_segment_size": true, "local_buffer_size": true, "protocol": true, "device_name": true}

func decodeClusterKeys(o *obj, k *ClusterKeys) {
	o.str(ServeKeyMaster, &k.Master, true)
	o.str(ServeKeyMetadata, &k.Metadata, true)
	o.str(ServeKeyHostAddress, &k.HostAddress, true)
	if n := o.field(ServeKeyLocalBufferSize); n != nil && !isNull(n) {
		if n.kind == nodeScalar && (n.typ == scalarInt || n.typ == scalarString) {
			k.LocalBufferSize = n.text
		} else {
			o.errAt(n, ServeKeyLocalBufferSize, "want a size such as \"16MiB\", found "+n.describe(), "")
		}
	}
	o.str(ServeKeyProtocol, &k.Protocol, true)
	o.str(ServeKeyDeviceName, &k.DeviceName, true)
	o.str(ServeKeyMooncakeConfig, &k.MooncakeConfig, true)
	if n := o.field(ServeKeyPoolTimeout); n != nil && !isNull(n) {
		k.PoolTimeout = readDuration(o, ServeKeyPoolTimeout, n)
	}
	o.str(ServeKeyMasterAdmin, &k.MasterAdmin, true)
	if v, ok := o.boolv(ServeKeyObjectChecksum, boolStrict); ok {
		k.ObjectChecksum = v
	}
	if n := o.field(ServeKeyLocateWindow); n != nil && !isNull(n) {
		k.LocateWindow = readDuration(o, ServeKeyLocateWindow, n)
	}
	if n := o.field(ServeKeyTransferPort); n != nil && !isNull(n) {
		if n.kind == nodeScalar && n.typ == scalarInt && !n.overflow && n.i >= 0 && n.i <= 65535 {
			k.TransferPort = int(n.i)
		} else {
			o.errAt(n, ServeKeyTransferPort, "want a port number between 0 and 65535, found "+n.describe(), "")
		}
	}
}
