package transfer_test

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/mooncake/transfer"
)

// The descriptors real engines published decode to the fields a transfer needs, and what kvctl
// encodes carries every field the wheel's engine writes.
func TestDescriptorsFromRealEngines(t *testing.T) {
	b, err := os.ReadFile("testdata/metadata-0.3.13.post1.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		SegmentName string `json:"segment_name"`
		RAM         string `json:"ram"`
		RPCMeta     string `json:"rpc_meta"`
		RAMSource   string `json:"ram_source_3b5a594"`
	}
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	d, err := transfer.DecodeSegmentDesc([]byte(fx.RAM))
	if err != nil {
		t.Fatal(err)
	}
	want := transfer.BufferDesc{Name: fx.SegmentName, Addr: 139696092999696, Length: 2147483648}
	if d.Name != fx.SegmentName || d.Protocol != "tcp" || d.TCPDataHost != "127.0.0.1" || d.TCPDataPort != 15749 ||
		d.TCPProtoVersion != 2 || len(d.Buffers) != 1 || d.Buffers[0] != want {
		t.Errorf("wheel descriptor decoded as %+v", d)
	}
	m, err := transfer.DecodeRPCMeta([]byte(fx.RPCMeta))
	if err != nil || m.IPOrHostName != "127.0.0.1" || m.RPCPort != 15303 {
		t.Errorf("wheel rpc_meta decoded as %+v, %v", m, err)
	}
	old, err := transfer.DecodeSegmentDesc([]byte(fx.RAMSource))
	if err != nil || old.TCPDataHost != "" || len(old.Buffers) != 0 || old.TCPDataPort != 16041 {
		t.Errorf("3b5a594 descriptor decoded as %+v, %v", old, err)
	}

	enc, err := transfer.EncodeSegmentDesc(d)
	if err != nil {
		t.Fatal(err)
	}
	var theirs, ours map[string]any
	_ = json.Unmarshal([]byte(fx.RAM), &theirs)
	_ = json.Unmarshal(enc, &ours)
	for k := range theirs {
		if _, ok := ours[k]; !ok {
			t.Errorf("kvctl's descriptor lacks %q, which the wheel writes", k)
		}
	}
	// Addresses are JSON integers, never floats: 2^64-1 survives.
	big := transfer.SegmentDesc{Name: "s", Protocol: "tcp", TCPDataPort: 1,
		Buffers: []transfer.BufferDesc{{Name: "s", Addr: 1<<64 - 2, Length: 1}}}
	enc, err = transfer.EncodeSegmentDesc(big)
	if err != nil || !strings.Contains(string(enc), `"addr":18446744073709551614`) {
		t.Fatalf("encoded %s, %v", enc, err)
	}
}

func TestDescriptorValidation(t *testing.T) {
	for _, tc := range []struct{ name, json string }{
		{"not json", `{"name":`},
		{"trailing data", `{"name":"s","protocol":"tcp","tcp_data_port":1} {}`},
		{"rdma", `{"name":"s","protocol":"rdma","tcp_data_port":1}`},
		{"no port", `{"name":"s","protocol":"tcp"}`},
		{"port 0", `{"name":"s","protocol":"tcp","tcp_data_port":0}`},
		{"port too big", `{"name":"s","protocol":"tcp","tcp_data_port":65536}`},
		{"no name", `{"protocol":"tcp","tcp_data_port":1}`},
		{"buffer at 0", `{"name":"s","protocol":"tcp","tcp_data_port":1,"buffers":[{"name":"b","addr":0,"length":1}]}`},
		{"empty buffer", `{"name":"s","protocol":"tcp","tcp_data_port":1,"buffers":[{"name":"b","addr":1,"length":0}]}`},
		{"buffer wraps", `{"name":"s","protocol":"tcp","tcp_data_port":1,"buffers":[{"name":"b","addr":18446744073709551615,"length":2}]}`},
		{"negative addr", `{"name":"s","protocol":"tcp","tcp_data_port":1,"buffers":[{"name":"b","addr":-1,"length":2}]}`},
		{"float addr", `{"name":"s","protocol":"tcp","tcp_data_port":1,"buffers":[{"name":"b","addr":1.5,"length":2}]}`},
		{"host with a slash", `{"name":"s","protocol":"tcp","tcp_data_port":1,"tcp_data_host":"a/b"}`},
		{"multi-protocol without tcp", `{"name":"s","protocol":["rdma","cxl"],"tcp_data_port":1}`},
	} {
		if _, err := transfer.DecodeSegmentDesc([]byte(tc.json)); !errors.Is(err, transfer.ErrDescriptor) {
			t.Errorf("%s: %v, want ErrDescriptor", tc.name, err)
		}
	}
	d, err := transfer.DecodeSegmentDesc([]byte(`{"name":"s","protocol":["cxl","tcp"],"tcp_data_port":7}`))
	if err != nil || d.Protocol != "tcp" || d.TCPProtoVersion != 1 {
		t.Errorf("multi-protocol descriptor with tcp and no tcp_proto_version: %+v, %v", d, err)
	}
	if _, err := transfer.DecodeSegmentDesc(make([]byte, transfer.MaxMetadataValue+1)); !errors.Is(err, transfer.ErrDescriptor) {
		t.Errorf("oversized descriptor: %v", err)
	}
	if _, err := transfer.NewMetadataClient("ftp://x/metadata", transfer.MetadataOptions{}); err == nil {
		t.Error("a non-HTTP metadata URL was accepted")
	}
}
