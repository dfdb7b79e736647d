package masterrpc

import (
	"crypto/md5" //nolint:gosec // coro_rpc derives function ids from MD5; an identifier, not security
	"encoding/binary"
	"fmt"
	"sync"
)

// coro_rpc framing constants.
const (
	rpcMagic       = 0x15
	reqHeaderLen   = 20
	respHeaderLen  = 16
	maxRequestBody = 64 << 20
	// MaxResponseBody bounds a response body the client accepts; a header announcing more is
	// a protocol error and the connection is dropped.
	MaxResponseBody = 64 << 20
)

// functionID is coro_rpc's id of a registered handler: the first four bytes of the MD5 of its
// qualified name, read big-endian. Each method's id is computed once.
func functionID(method string) uint32 {
	fidMu.RLock()
	id, ok := fids[method]
	fidMu.RUnlock()
	if ok {
		return id
	}
	sum := md5.Sum([]byte("mooncake::WrappedMasterService::" + method)) //nolint:gosec // see import
	id = binary.BigEndian.Uint32(sum[:4])
	fidMu.Lock()
	fids[method] = id
	fidMu.Unlock()
	return id
}

var (
	fidMu sync.RWMutex
	fids  = map[string]uint32{}
)

func appendRequestHeader(b []byte, seq, fid uint32, bodyLen int) []byte {
	b = append(b, rpcMagic, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, seq)
	b = binary.LittleEndian.AppendUint32(b, fid)
	b = binary.LittleEndian.AppendUint32(b, uint32(bodyLen))
	return binary.LittleEndian.AppendUint32(b, 0)
}

// respHeader is a coro_rpc response header.
type respHeader struct {
	ErrCode   uint8
	Seq       uint32
	Length    uint32
	AttachLen uint32
}

func parseRespHeader(b []byte) (respHeader, error) {
	if len(b) < respHeaderLen {
		return respHeader{}, fmt.Errorf("%w: response header of %d bytes", ErrProtocol, len(b))
	}
	if b[0] != rpcMagic {
		return respHeader{}, fmt.Errorf("%w: response magic %#02x, want %#02x (not a coro_rpc server)", ErrProtocol, b[0], rpcMagic)
	}
	if b[1] != 0 {
		return respHeader{}, fmt.Errorf("%w: coro_rpc header version %d, kvctl speaks version 0", ErrProtocol, b[1])
	}
	h := respHeader{
		ErrCode:   b[2],
		Seq:       binary.LittleEndian.Uint32(b[4:]),
		Length:    binary.LittleEndian.Uint32(b[8:]),
		AttachLen: binary.LittleEndian.Uint32(b[12:]),
	}
	if uint64(h.Length)+uint64(h.AttachLen) > MaxResponseBody {
		return respHeader{}, fmt.Errorf("%w: response of %d+%d bytes, above the %d-byte bound", ErrProtocol, h.Length, h.AttachLen, MaxResponseBody)
	}
	return h, nil
}
