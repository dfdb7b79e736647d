package transfer_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"

	"github.com/kvctl/kvctl/mooncake/transfer"
)

func FuzzDecodeHeader(f *testing.F) {
	for _, s := range []string{
		"001000000000000010e04f7e297f00008000000000000000",
		"f0490200000000001000507e297f00008100000000000000",
		"00100000000000000000002fad7f0000802403f339560000",
		"ffffffffffffffffffffffffffffffffff",
	} {
		b, _ := hex.DecodeString(s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := transfer.DecodeHeader(b)
		if len(b) < transfer.HeaderSize {
			if !errors.Is(err, transfer.ErrMalformed) {
				t.Fatalf("%d bytes decoded without ErrMalformed: %v", len(b), err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		enc := transfer.AppendHeader(nil, h)
		if !bytes.Equal(enc[:17], b[:17]) {
			t.Fatalf("re-encoded %x from %x", enc, b[:24])
		}
		if end, ok := h.End(); ok != (end >= h.Addr) {
			t.Fatal("End inconsistent")
		}
	})
}

func FuzzDecodeStatus(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 'V', 'T', 'C', 'M'})
	f.Add([]byte{1, 0, 0, 0, 'V', 'T', 'C', 'M'})
	f.Add([]byte("{{{{{{{{"))
	f.Fuzz(func(t *testing.T, b []byte) {
		code, err := transfer.DecodeStatus(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if !bytes.Equal(transfer.AppendStatus(nil, code), b[:8]) {
			t.Fatalf("status %d does not re-encode to %x", code, b[:8])
		}
	})
}

func FuzzDecodeSegmentDesc(f *testing.F) {
	for _, s := range []string{
		`{"buffers":[{"addr":139696092999696,"length":2147483648,"name":"127.0.0.1:17777"}],"name":"127.0.0.1:17777","protocol":"tcp","rdma_server_name":"","tcp_data_host":"127.0.0.1","tcp_data_port":15749,"tcp_proto_version":2,"timestamp":"2026-12-01 15:15:32.612255"}`,
		`{"buffers":[],"name":"127.0.0.1:14277","protocol":"tcp","tcp_data_port":16041,"tcp_proto_version":2,"timestamp":"2026-11-30 06:36:43.652771"}`,
		`{"buffers":[{"addr":18446744073709551615,"length":2,"name":"x"}],"name":"x","protocol":"tcp","tcp_data_port":1}`,
		`{"name":"x","protocol":["cxl","tcp"],"tcp_data_port":1,"buffers":null}`,
		`{"name":"x","protocol":"rdma","tcp_data_port":0}`,
		`[]`, `null`, `{"name":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := transfer.DecodeSegmentDesc(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrDescriptor) {
				t.Fatalf("error %v is not ErrDescriptor", err)
			}
			return
		}
		// Whatever decodes is usable: valid, and it survives an encode/decode round trip.
		if err := d.Validate(); err != nil {
			t.Fatalf("decoded an invalid descriptor: %v", err)
		}
		if d.Timestamp == "" {
			d.Timestamp = "fixed" // EncodeSegmentDesc stamps an empty one with the time
		}
		enc, err := transfer.EncodeSegmentDesc(d)
		if err != nil {
			t.Fatalf("decoded descriptor does not encode: %v", err)
		}
		back, err := transfer.DecodeSegmentDesc(enc)
		if err != nil {
			t.Fatalf("re-decode of %s: %v", enc, err)
		}
		x, _ := json.Marshal(back)
		y, _ := json.Marshal(d)
		if !bytes.Equal(x, y) {
			t.Fatalf("round trip changed the descriptor:\n%s\n%s", y, x)
		}
		for _, buf := range d.Buffers {
			if !d.Contains(buf.Addr, buf.Length) {
				t.Fatalf("Contains disagrees with buffer %+v", buf)
			}
		}
	})
}

func FuzzDecodeRPCMeta(f *testing.F) {
	f.Add([]byte(`{"ip_or_host_name":"127.0.0.1","rpc_port":15711}`))
	f.Add([]byte(`{"ip_or_host_name":"","rpc_port":-1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := transfer.DecodeRPCMeta(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrDescriptor) {
				t.Fatalf("error %v is not ErrDescriptor", err)
			}
			return
		}
		if m.IPOrHostName == "" || m.RPCPort < 0 || m.RPCPort > 65535 {
			t.Fatalf("accepted %+v", m)
		}
	})
}
