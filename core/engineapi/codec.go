package engineapi

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// codec is the protobuf codec of the engine socket, on both ends. It differs from gRPC's own
// only in its buffers: they come from bufferPool, which does not clear them, a message that
// arrived in a single buffer is decoded in place instead of copied into a new one first, and a
// LookupRequest is decoded by decodeLookup, which copies the prompt once instead of twice.
type codec struct{}

var _ encoding.CodecV2 = codec{}

// Name is the content subtype, the same as gRPC's protobuf codec so that other clients interoperate.
func (codec) Name() string { return "proto" }

// Marshal encodes v, a protobuf message, into one pooled buffer.
func (codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("engine api codec: %T is not a protobuf message", v)
	}
	size := proto.Size(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	bp := bufferPool.Get(size)
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*bp)[:0], m)
	if err != nil {
		bufferPool.Put(bp)
		return nil, err
	}
	*bp = b
	return mem.BufferSlice{mem.NewBuffer(bp, bufferPool)}, nil
}

// Unmarshal decodes data into v, a protobuf message. The message keeps no reference to data.
func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if lr, ok := v.(*enginepb.LookupRequest); ok {
		return decodeLookup(data, lr)
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("engine api codec: %T is not a protobuf message", v)
	}
	if len(data) == 1 {
		return proto.Unmarshal(data[0].ReadOnlyData(), m)
	}
	bp := bufferPool.Get(data.Len())
	defer bufferPool.Put(bp)
	data.CopyTo(*bp)
	return proto.Unmarshal(*bp, m)
}
