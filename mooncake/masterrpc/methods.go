package masterrpc

import (
	"context"
	"fmt"
)

// DefaultTenant is the tenant every key-level call names unless told otherwise, as Mooncake's
// own client does.
const DefaultTenant = "default"

func decodeErr(method string, err error) error {
	return fmt.Errorf("%w: %s response: %w", ErrProtocol, method, err)
}

func codeErr(method string, code int32) error {
	if code == 0 {
		return nil
	}
	return &CodeError{Method: method, Code: code}
}

// ServiceReady asks the master whether it serves, and returns its store protocol version.
func (c *Client) ServiceReady(ctx context.Context) (string, error) {
	body, err := c.call(ctx, "ServiceReady", nil)
	if err != nil {
		return "", err
	}
	v, code, err := decodeString(body)
	if err != nil {
		return "", decodeErr("ServiceReady", err)
	}
	return v, codeErr("ServiceReady", code)
}

// GetStorageConfig returns the master's storage configuration, which a client reads at start.
func (c *Client) GetStorageConfig(ctx context.Context) (StorageConfig, error) {
	body, err := c.call(ctx, "GetStorageConfig", nil)
	if err != nil {
		return StorageConfig{}, err
	}
	cfg, code, err := decodeStorageConfig(body)
	if err != nil {
		return StorageConfig{}, decodeErr("GetStorageConfig", err)
	}
	return cfg, codeErr("GetStorageConfig", code)
}

func (c *Client) void(ctx context.Context, method string, req []byte) error {
	body, err := c.call(ctx, method, req)
	if err != nil {
		return err
	}
	code, err := decodeVoid(body)
	if err != nil {
		return decodeErr(method, err)
	}
	return codeErr(method, code)
}

// MountSegment adds seg, owned by client, to the pool.
func (c *Client) MountSegment(ctx context.Context, seg Segment, client UUID) error {
	return c.void(ctx, "MountSegment", encodeMount(seg, client))
}

// ReMountSegment mounts segs again after the master lost them (a Ping answered
// ClientNeedRemount).
func (c *Client) ReMountSegment(ctx context.Context, segs []Segment, client UUID) error {
	return c.void(ctx, "ReMountSegment", encodeRemount(segs, client))
}

// UnmountSegment removes a segment; the objects stored in it are dropped by the master.
func (c *Client) UnmountSegment(ctx context.Context, segment, client UUID) error {
	return c.void(ctx, "UnmountSegment", encodeUnmount(segment, client))
}

// Ping is the heartbeat a segment owner sends (Mooncake's client: once a second); a client
// silent for the master's --client_ttl loses its segments.
func (c *Client) Ping(ctx context.Context, client UUID) (PingResponse, error) {
	body, err := c.call(ctx, "Ping", encodePing(client))
	if err != nil {
		return PingResponse{}, err
	}
	p, code, err := decodePing(body)
	if err != nil {
		return PingResponse{}, decodeErr("Ping", err)
	}
	return p, codeErr("Ping", code)
}

// BatchExistKey returns, per key, 1 present, 0 absent or a negative error code.
func (c *Client) BatchExistKey(ctx context.Context, keys []string, tenant string) ([]int, error) {
	body, err := c.call(ctx, "BatchExistKey", encodeKeysTenant(keys, tenant))
	if err != nil {
		return nil, err
	}
	out, err := decodeBatchExist(body)
	if err == nil {
		err = checkCount("BatchExistKey", len(out), len(keys))
	}
	if err != nil {
		return nil, decodeErr("BatchExistKey", err)
	}
	return out, nil
}

// BatchPutStart allocates space for each key (sizes[i] bytes) and returns, per key, the
// replicas to write or an error code (-705 when the key already exists).
func (c *Client) BatchPutStart(ctx context.Context, client UUID, keys []string, sizes []uint64, cfg ReplicateConfig, tenant string) ([]PutStartResult, error) {
	if len(sizes) != len(keys) {
		return nil, fmt.Errorf("BatchPutStart: %d sizes for %d keys", len(sizes), len(keys))
	}
	body, err := c.call(ctx, "BatchPutStart", encodeBatchPutStart(client, keys, sizes, cfg, tenant))
	if err != nil {
		return nil, err
	}
	out, err := decodeBatchPutStart(body)
	if err == nil {
		err = checkCount("BatchPutStart", len(out), len(keys))
	}
	if err != nil {
		return nil, decodeErr("BatchPutStart", err)
	}
	return out, nil
}

func (c *Client) batchVoid(ctx context.Context, method string, req []byte, n int) ([]int32, error) {
	body, err := c.call(ctx, method, req)
	if err != nil {
		return nil, err
	}
	out, err := decodeBatchVoid(body)
	if err == nil {
		err = checkCount(method, len(out), n)
	}
	if err != nil {
		return nil, decodeErr(method, err)
	}
	return out, nil
}

// BatchPutEnd marks each key's written replicas complete, making the object readable.
func (c *Client) BatchPutEnd(ctx context.Context, client UUID, keys []string, tenant string) ([]int32, error) {
	return c.batchVoid(ctx, "BatchPutEnd", encodeBatchPutEnd(client, keys, tenant), len(keys))
}

// BatchPutEndMeta is BatchPutEnd with each key's ObjectMeta, carrying its checksum when set.
func (c *Client) BatchPutEndMeta(ctx context.Context, client UUID, metas []ObjectMeta, tenant string) ([]int32, error) {
	return c.batchVoid(ctx, "BatchPutEnd", encodeBatchPutEndMeta(client, metas, tenant), len(metas))
}

// BatchPutRevoke abandons started puts; their space is freed and nothing becomes readable.
func (c *Client) BatchPutRevoke(ctx context.Context, client UUID, keys []string, tenant string) ([]int32, error) {
	return c.batchVoid(ctx, "BatchPutRevoke", encodeBatchPutRevoke(client, keys, tenant), len(keys))
}

// BatchGetReplicaList returns each key's replicas (granting a read lease) or its error code.
func (c *Client) BatchGetReplicaList(ctx context.Context, keys []string, tenant string) ([]ReplicaListResult, error) {
	body, err := c.call(ctx, "BatchGetReplicaList", encodeKeysTenant(keys, tenant))
	if err != nil {
		return nil, err
	}
	out, err := decodeBatchReplicaList(body)
	if err == nil {
		err = checkCount("BatchGetReplicaList", len(out), len(keys))
	}
	if err != nil {
		return nil, decodeErr("BatchGetReplicaList", err)
	}
	return out, nil
}

// Remove deletes one object and returns the master's code (0, -704 not found, -706 under a
// lease when force is false).
func (c *Client) Remove(ctx context.Context, key string, force bool, tenant string) (int32, error) {
	body, err := c.call(ctx, "Remove", encodeRemove(key, force, tenant))
	if err != nil {
		return 0, err
	}
	code, err := decodeVoid(body)
	if err != nil {
		return 0, decodeErr("Remove", err)
	}
	return code, nil
}
