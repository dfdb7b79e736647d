package engineapi

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// UnmarshalCall decodes one call channel message into v, a protobuf message, exactly as the
// engine socket's gRPC codec decodes the same bytes (a LookupRequest's prompt is copied once).
// v keeps no reference to data.
func UnmarshalCall(data []byte, v any) error {
	return codec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, v)
}

// AppendCall appends the encoding of v, a protobuf message, to b.
func AppendCall(b []byte, v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return b, fmt.Errorf("call channel: %T is not a protobuf message", v)
	}
	return proto.MarshalOptions{}.MarshalAppend(b, m)
}
