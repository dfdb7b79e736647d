package transfer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Metadata keys, as Mooncake's Transfer Engine writes them (reference/mooncake-wire.md §6).
const (
	segmentKeyPrefix = "mooncake/ram/"
	rpcMetaKeyPrefix = "mooncake/rpc_meta/"
)

// Limits on what a metadata server or a peer's descriptor may hand kvctl.
const (
	// MaxMetadataValue bounds one value read from the metadata server.
	MaxMetadataValue = 4 << 20
	// MaxSegmentBuffers bounds the buffers one descriptor may list.
	MaxSegmentBuffers = 65536
	// maxNameLen bounds segment and buffer names.
	maxNameLen = 1024
)

// ProtocolTCP is the descriptor protocol of a TCP segment.
const ProtocolTCP = "tcp"

// ErrNotFound reports a metadata key the server does not hold.
var ErrNotFound = errors.New("metadata not found")

// ErrDescriptor reports a segment descriptor or rpc_meta value kvctl cannot use.
var ErrDescriptor = errors.New("invalid segment descriptor")

// SegmentKey returns the metadata key of a segment's descriptor.
func SegmentKey(name string) string { return segmentKeyPrefix + name }

// RPCMetaKey returns the metadata key of a segment's rpc_meta (the host peers connect to).
func RPCMetaKey(name string) string { return rpcMetaKeyPrefix + name }

// BufferDesc is one registered buffer of a segment.
type BufferDesc struct {
	Name   string `json:"name"`
	Addr   uint64 `json:"addr"`
	Length uint64 `json:"length"`
}

// SegmentDesc is the descriptor a TCP segment publishes under SegmentKey(Name). The JSON
// field names are Mooncake's; a real Transfer Engine accepts what EncodeSegmentDesc writes.
type SegmentDesc struct {
	Name     string       `json:"name"`
	Protocol string       `json:"protocol"`
	Buffers  []BufferDesc `json:"buffers"`
	// TCPDataHost is the host the data server listens on. Mooncake 0.3.13 writes it; older
	// descriptors lack it and initiators take the host from rpc_meta.
	TCPDataHost string `json:"tcp_data_host,omitempty"`
	// TCPDataPort is the port the segment's Transfer Engine server listens on.
	TCPDataPort int `json:"tcp_data_port"`
	// TCPProtoVersion is 2 for targets that send status frames; a descriptor without it is v1.
	TCPProtoVersion int `json:"tcp_proto_version"`
	// Timestamp is the publisher's local time, "2006-01-02 15:04:05.000000"; informational.
	Timestamp string `json:"timestamp,omitempty"`
	// RDMAServerName is empty for TCP segments; Mooncake 0.3.13 writes the field regardless.
	RDMAServerName string `json:"rdma_server_name"`
}

// RPCMeta is the value under RPCMetaKey: where a segment's owner can be reached.
type RPCMeta struct {
	IPOrHostName string `json:"ip_or_host_name"`
	RPCPort      int    `json:"rpc_port"`
}

// Validate checks what a Transfer Engine needs from a TCP descriptor: a name, protocol tcp, a
// port, and buffers with a name, a non-zero address and length that do not wrap.
func (d *SegmentDesc) Validate() error {
	var errs []error
	if d.Name == "" || len(d.Name) > maxNameLen {
		errs = append(errs, fmt.Errorf("name %.40q: want 1 to %d bytes", d.Name, maxNameLen))
	}
	if d.Protocol != ProtocolTCP {
		errs = append(errs, fmt.Errorf("protocol %.40q: kvctl speaks only %q", d.Protocol, ProtocolTCP))
	}
	if d.TCPDataPort < 1 || d.TCPDataPort > 65535 {
		errs = append(errs, fmt.Errorf("tcp_data_port %d: want 1..65535", d.TCPDataPort))
	}
	if len(d.TCPDataHost) > 255 || strings.ContainsAny(d.TCPDataHost, "/ \t\r\n") {
		errs = append(errs, fmt.Errorf("tcp_data_host %.40q: not a host name or address", d.TCPDataHost))
	}
	if d.TCPProtoVersion < 0 {
		errs = append(errs, fmt.Errorf("tcp_proto_version %d: negative", d.TCPProtoVersion))
	}
	if len(d.Buffers) > MaxSegmentBuffers {
		errs = append(errs, fmt.Errorf("%d buffers: at most %d", len(d.Buffers), MaxSegmentBuffers))
	}
	for i, b := range d.Buffers {
		switch {
		case b.Name == "" || len(b.Name) > maxNameLen:
			errs = append(errs, fmt.Errorf("buffers[%d].name %.40q: want 1 to %d bytes", i, b.Name, maxNameLen))
		case b.Addr == 0:
			errs = append(errs, fmt.Errorf("buffers[%d].addr: 0", i))
		case b.Length == 0:
			errs = append(errs, fmt.Errorf("buffers[%d].length: 0", i))
		case b.Addr+b.Length < b.Addr:
			errs = append(errs, fmt.Errorf("buffers[%d]: addr %#x + length %d wraps past 2^64", i, b.Addr, b.Length))
		}
		if len(errs) > 8 {
			break
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w %.80q: %w", ErrDescriptor, d.Name, errors.Join(errs...))
	}
	return nil
}

// Contains reports whether [addr, addr+size) lies inside one of the descriptor's buffers.
func (d *SegmentDesc) Contains(addr, size uint64) bool {
	end := addr + size
	if end < addr {
		return false
	}
	for _, b := range d.Buffers {
		if b.Addr <= addr && end <= b.Addr+b.Length && b.Addr+b.Length >= b.Addr {
			return true
		}
	}
	return false
}

// EncodeSegmentDesc validates d and returns its JSON, with the fields a real Transfer Engine
// reads. A zero TCPProtoVersion is written as 2 (this package's server speaks v2) and an empty
// Timestamp as now.
func EncodeSegmentDesc(d SegmentDesc) ([]byte, error) {
	if d.Buffers == nil {
		d.Buffers = []BufferDesc{}
	}
	if d.TCPProtoVersion == 0 {
		d.TCPProtoVersion = 2
	}
	if d.Timestamp == "" {
		d.Timestamp = time.Now().Format("2006-01-02 15:04:05.000000")
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(d)
}

// DecodeSegmentDesc parses and validates a descriptor read from the metadata server. Numbers
// must be integers in range (a real publisher writes addresses as JSON integers up to 2^64-1).
func DecodeSegmentDesc(b []byte) (SegmentDesc, error) {
	if len(b) > MaxMetadataValue {
		return SegmentDesc{}, fmt.Errorf("%w: %d bytes, at most %d", ErrDescriptor, len(b), MaxMetadataValue)
	}
	var raw struct {
		Name            *string          `json:"name"`
		Protocol        json.RawMessage  `json:"protocol"`
		Buffers         []BufferDesc     `json:"buffers"`
		TCPDataHost     string           `json:"tcp_data_host"`
		RDMAServerName  string           `json:"rdma_server_name"`
		TCPDataPort     *int             `json:"tcp_data_port"`
		TCPProtoVersion *int             `json:"tcp_proto_version"`
		Timestamp       string           `json:"timestamp"`
		Devices         *json.RawMessage `json:"devices"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		return SegmentDesc{}, fmt.Errorf("%w: %w", ErrDescriptor, err)
	}
	if dec.More() {
		return SegmentDesc{}, fmt.Errorf("%w: trailing data after the JSON object", ErrDescriptor)
	}
	if raw.Buffers == nil {
		raw.Buffers = []BufferDesc{}
	}
	d := SegmentDesc{Buffers: raw.Buffers, Timestamp: raw.Timestamp, TCPDataHost: raw.TCPDataHost, RDMAServerName: raw.RDMAServerName}
	if raw.Name != nil {
		d.Name = *raw.Name
	}
	// Multi-protocol builds write protocol as an array; kvctl accepts one that includes tcp.
	if len(raw.Protocol) > 0 && raw.Protocol[0] == '[' {
		var list []string
		if err := json.Unmarshal(raw.Protocol, &list); err != nil {
			return SegmentDesc{}, fmt.Errorf("%w: protocol: %w", ErrDescriptor, err)
		}
		for _, p := range list {
			if p == ProtocolTCP {
				d.Protocol = ProtocolTCP
			}
		}
		if d.Protocol == "" {
			d.Protocol = strings.Join(list, ",")
		}
	} else if len(raw.Protocol) > 0 {
		if err := json.Unmarshal(raw.Protocol, &d.Protocol); err != nil {
			return SegmentDesc{}, fmt.Errorf("%w: protocol: %w", ErrDescriptor, err)
		}
	}
	if raw.TCPDataPort == nil {
		return SegmentDesc{}, fmt.Errorf("%w %.80q: no tcp_data_port", ErrDescriptor, d.Name)
	}
	d.TCPDataPort = *raw.TCPDataPort
	if raw.TCPProtoVersion != nil {
		d.TCPProtoVersion = *raw.TCPProtoVersion
	} else {
		d.TCPProtoVersion = 1
	}
	if err := d.Validate(); err != nil {
		return SegmentDesc{}, err
	}
	return d, nil
}

// DecodeRPCMeta parses an rpc_meta value.
func DecodeRPCMeta(b []byte) (RPCMeta, error) {
	var m RPCMeta
	if len(b) > MaxMetadataValue {
		return m, fmt.Errorf("%w: rpc_meta of %d bytes", ErrDescriptor, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return RPCMeta{}, fmt.Errorf("%w: rpc_meta: %w", ErrDescriptor, err)
	}
	if m.IPOrHostName == "" || len(m.IPOrHostName) > 255 || strings.ContainsAny(m.IPOrHostName, "/ \t\r\n") {
		return RPCMeta{}, fmt.Errorf("%w: rpc_meta ip_or_host_name %.40q", ErrDescriptor, m.IPOrHostName)
	}
	if m.RPCPort < 0 || m.RPCPort > 65535 {
		return RPCMeta{}, fmt.Errorf("%w: rpc_meta rpc_port %d", ErrDescriptor, m.RPCPort)
	}
	return m, nil
}

// Endpoint is where a segment's Transfer Engine data server answers.
type Endpoint struct {
	// Addr is host:port of the TCP data server, ready for Client.Read and Client.Write.
	Addr string
	// ProtoVersion is the descriptor's tcp_proto_version (1 when absent).
	ProtoVersion int
	// Segment is the whole descriptor, for bounds checks before a transfer.
	Segment SegmentDesc
}

// MetadataOptions configures a MetadataClient.
type MetadataOptions struct {
	// HTTPClient defaults to a client with Timeout.
	HTTPClient *http.Client
	// Timeout bounds one request when HTTPClient is nil; 10 s when zero.
	Timeout time.Duration
}

// MetadataClient talks to an HTTP metadata server such as the one mooncake_master serves with
// --enable_http_metadata_server. It is safe for concurrent use.
type MetadataClient struct {
	base string
	http *http.Client
}

// NewMetadataClient returns a client for the metadata server at endpoint, the URL a Mooncake
// client is configured with ("http://host:port/metadata"). An endpoint without a path gets
// "/metadata".
func NewMetadataClient(endpoint string, opts MetadataOptions) (*MetadataClient, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("metadata server %q: %w", endpoint, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("metadata server %q: want http://host:port/metadata", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/metadata"
	}
	u.RawQuery, u.Fragment = "", ""
	hc := opts.HTTPClient
	if hc == nil {
		t := opts.Timeout
		if t <= 0 {
			t = 10 * time.Second
		}
		hc = &http.Client{Timeout: t}
	}
	return &MetadataClient{base: u.String(), http: hc}, nil
}

// Endpoint returns the metadata server URL the client talks to.
func (m *MetadataClient) Endpoint() string { return m.base }

func (m *MetadataClient) url(key string) string {
	return m.base + "?key=" + url.QueryEscape(key)
}

func (m *MetadataClient) do(ctx context.Context, method, key string, body []byte) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, m.url(key), rd)
	if err != nil {
		return nil, fmt.Errorf("metadata %s %s: %w", method, key, err)
	}
	req.Header.Set("Accept", "*/*")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := m.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metadata %s %s: %w", method, key, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxMetadataValue+1))
	if err != nil {
		return nil, fmt.Errorf("metadata %s %s: reading response: %w", method, key, err)
	}
	if len(data) > MaxMetadataValue {
		return nil, fmt.Errorf("metadata %s %s: response larger than %d bytes", method, key, MaxMetadataValue)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("metadata %s %s: %w", method, key, ErrNotFound)
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("metadata %s %s: %s: %.200s", method, key, resp.Status, data)
	}
	return data, nil
}

// Get returns the value stored under key, ErrNotFound when there is none.
func (m *MetadataClient) Get(ctx context.Context, key string) ([]byte, error) {
	return m.do(ctx, http.MethodGet, key, nil)
}

// Put stores value under key.
func (m *MetadataClient) Put(ctx context.Context, key string, value []byte) error {
	if value == nil {
		value = []byte{}
	}
	_, err := m.do(ctx, http.MethodPut, key, value)
	return err
}

// Delete removes key. A key that is already gone is not an error.
func (m *MetadataClient) Delete(ctx context.Context, key string) error {
	_, err := m.do(ctx, http.MethodDelete, key, nil)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// GetSegment reads and validates a peer's descriptor.
func (m *MetadataClient) GetSegment(ctx context.Context, name string) (SegmentDesc, error) {
	b, err := m.Get(ctx, SegmentKey(name))
	if err != nil {
		return SegmentDesc{}, err
	}
	d, err := DecodeSegmentDesc(b)
	if err != nil {
		return SegmentDesc{}, fmt.Errorf("segment %.80q: %w", name, err)
	}
	return d, nil
}

// GetRPCMeta reads a peer's rpc_meta.
func (m *MetadataClient) GetRPCMeta(ctx context.Context, name string) (RPCMeta, error) {
	b, err := m.Get(ctx, RPCMetaKey(name))
	if err != nil {
		return RPCMeta{}, err
	}
	r, err := DecodeRPCMeta(b)
	if err != nil {
		return RPCMeta{}, fmt.Errorf("segment %.80q: %w", name, err)
	}
	return r, nil
}

// PublishSegment announces a segment the way a real client does: rpc_meta first, then the
// descriptor. host is the address peers connect to; rpcPort is what rpc_meta advertises
// (kvctl runs no handshake daemon for TCP; the data port is a sensible value). An empty
// d.TCPDataHost is set to host. Call it again
// after every Register or Unregister with the new buffer list.
func (m *MetadataClient) PublishSegment(ctx context.Context, d SegmentDesc, host string, rpcPort int) error {
	if d.TCPDataHost == "" {
		d.TCPDataHost = host
	}
	enc, err := EncodeSegmentDesc(d)
	if err != nil {
		return err
	}
	meta, err := json.Marshal(RPCMeta{IPOrHostName: host, RPCPort: rpcPort})
	if err != nil {
		return err
	}
	if _, err := DecodeRPCMeta(meta); err != nil {
		return err
	}
	if err := m.Put(ctx, RPCMetaKey(d.Name), meta); err != nil {
		return err
	}
	return m.Put(ctx, SegmentKey(d.Name), enc)
}

// RemoveSegment deletes a segment's rpc_meta and descriptor, as a real client does on
// shutdown. Both deletes are attempted.
func (m *MetadataClient) RemoveSegment(ctx context.Context, name string) error {
	return errors.Join(m.Delete(ctx, RPCMetaKey(name)), m.Delete(ctx, SegmentKey(name)))
}

// Resolve finds the TCP data address of the segment called name: the descriptor's
// tcp_data_host when it has one (Mooncake ≥ 0.3.13), else the host from its rpc_meta, and the
// descriptor's tcp_data_port.
func (m *MetadataClient) Resolve(ctx context.Context, name string) (Endpoint, error) {
	d, err := m.GetSegment(ctx, name)
	if err != nil {
		return Endpoint{}, err
	}
	host := d.TCPDataHost
	if host == "" {
		r, err := m.GetRPCMeta(ctx, name)
		if err != nil {
			return Endpoint{}, err
		}
		host = r.IPOrHostName
	}
	return Endpoint{
		Addr:         net.JoinHostPort(host, strconv.Itoa(d.TCPDataPort)),
		ProtoVersion: d.TCPProtoVersion,
		Segment:      d,
	}, nil
}
