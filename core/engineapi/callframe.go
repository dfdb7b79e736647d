package engineapi

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// A call channel (OpenCallChannel in engine.proto) carries engine calls over a unix
// SOCK_SEQPACKET socket pair instead of HTTP/2: each request and each response is a message of
// one or more frames, and each frame is one datagram of the socket, so the kernel keeps frame
// boundaries and a frame is read whole or reported as truncated. This file is the frame format
// both ends use; core/daemon serves channels and CallChannel (callchan.go) is the Go client.

// Frame layout and bounds.
const (
	// CallFrameMagic opens every frame: "KVC1" read as a little-endian uint32.
	CallFrameMagic uint32 = 0x3143564b
	// CallFrameHeaderBytes is the size of a frame's header.
	CallFrameHeaderBytes = 16
	// MaxCallFrameBytes is the largest frame, header included, that either end sends or
	// accepts. It stays under the smallest default socket send buffer, so a frame never needs
	// a raised SO_SNDBUF.
	MaxCallFrameBytes = 64 << 10
	// MaxCallFragmentBytes is the most message bytes one frame carries.
	MaxCallFragmentBytes = MaxCallFrameBytes - CallFrameHeaderBytes
	// CallFrameMore is the flag of a frame that more frames of the same message follow.
	CallFrameMore uint8 = 1
	// maxKeptAssemblyBytes is the largest message buffer a CallAssembler keeps between
	// messages.
	maxKeptAssemblyBytes = 16 * MaxCallFrameBytes
	// maxCallErrorBytes bounds an error message sent in a response.
	maxCallErrorBytes = 4 << 10
)

// ErrCallFrame is wrapped by every error about a malformed frame or message.
var ErrCallFrame = errors.New("call channel frame")

// CallMessageTooLargeError is the error of a message whose frames add up to more than the
// assembler's bound. It is an ErrCallFrame.
type CallMessageTooLargeError struct {
	Bytes, Limit int
}

func (e *CallMessageTooLargeError) Error() string {
	return fmt.Sprintf("%v: a message of %d bytes, above the limit of %d", ErrCallFrame, e.Bytes, e.Limit)
}

// Is makes a CallMessageTooLargeError match ErrCallFrame.
func (e *CallMessageTooLargeError) Is(target error) bool { return target == ErrCallFrame }

// CallHeader is a frame's header.
type CallHeader struct {
	Method enginepb.CallChannelMethod
	Flags  uint8
	// Status is 0 in a request; in a response, the gRPC status code (0 OK).
	Status uint8
	CallID uint64
}

// AppendCallHeader appends h's 16 bytes to b.
func AppendCallHeader(b []byte, h CallHeader) []byte {
	b = binary.LittleEndian.AppendUint32(b, CallFrameMagic)
	b = binary.LittleEndian.AppendUint16(b, uint16(h.Method))
	b = append(b, h.Flags, h.Status)
	return binary.LittleEndian.AppendUint64(b, h.CallID)
}

// ParseCallFrame splits frame into its header and fragment. It refuses a frame shorter than a
// header, longer than MaxCallFrameBytes, with another magic or with unknown flags; the header is
// returned whenever the frame held 16 bytes, so that an error can still name the call.
func ParseCallFrame(frame []byte) (CallHeader, []byte, error) {
	if len(frame) < CallFrameHeaderBytes {
		return CallHeader{}, nil, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrCallFrame, len(frame), CallFrameHeaderBytes)
	}
	h := CallHeader{
		Method: enginepb.CallChannelMethod(binary.LittleEndian.Uint16(frame[4:6])),
		Flags:  frame[6],
		Status: frame[7],
		CallID: binary.LittleEndian.Uint64(frame[8:16]),
	}
	if m := binary.LittleEndian.Uint32(frame[0:4]); m != CallFrameMagic {
		return h, nil, fmt.Errorf("%w: magic %#08x, want %#08x (\"KVC1\")", ErrCallFrame, m, CallFrameMagic)
	}
	if len(frame) > MaxCallFrameBytes {
		return h, nil, fmt.Errorf("%w: %d bytes, above the %d-byte limit", ErrCallFrame, len(frame), MaxCallFrameBytes)
	}
	if h.Flags&^CallFrameMore != 0 {
		return h, nil, fmt.Errorf("%w: unknown flags %#02x", ErrCallFrame, h.Flags)
	}
	return h, frame[CallFrameHeaderBytes:], nil
}

// AppendCallFrames splits msg into frames of at most MaxCallFrameBytes under header h (whose
// Flags are set per frame) and calls send with each, reusing buf for the frame. An empty msg is
// one frame of just the header.
func AppendCallFrames(buf []byte, h CallHeader, msg []byte, send func(frame []byte) error) ([]byte, error) {
	for first := true; first || len(msg) > 0; first = false {
		n := min(len(msg), MaxCallFragmentBytes)
		h.Flags = 0
		if n < len(msg) {
			h.Flags = CallFrameMore
		}
		buf = append(AppendCallHeader(buf[:0], h), msg[:n]...)
		if err := send(buf); err != nil {
			return buf, err
		}
		msg = msg[n:]
	}
	return buf, nil
}

// CallErrorMessage bounds an error message to what a response carries, cutting it at a rune
// boundary.
func CallErrorMessage(msg string) string {
	if len(msg) <= maxCallErrorBytes {
		return msg
	}
	cut := maxCallErrorBytes
	for cut > 0 && msg[cut]&0xc0 == 0x80 {
		cut--
	}
	return msg[:cut]
}

// CallAssembler joins the frames of one message at a time, holding at most max bytes of it. A
// message over the bound, or a frame of another call before the last frame of the one being
// joined, is an error that names the message; the assembler is then ready for the next message
// (an oversized message is skipped to its last frame first, so the two ends stay in step).
type CallAssembler struct {
	max     int
	buf     []byte
	cur     CallHeader
	open    bool // frames of cur have been added and its last has not
	skipped int  // bytes of cur dropped for being over max; nonzero while skipping
}

// NewCallAssembler returns an assembler of messages of at most maxBytes bytes.
func NewCallAssembler(maxBytes int) *CallAssembler { return &CallAssembler{max: maxBytes} }

// CallMessage is one whole message.
type CallMessage struct {
	Header CallHeader // with Flags 0
	Body   []byte     // valid until the next Add
}

// Add takes one frame. It returns a message when frame was its last, nil when more are to
// come. An error comes with the header of the message it is about (the zero header when the
// frame was too short to name one) and leaves the assembler ready for a new message.
func (a *CallAssembler) Add(frame []byte) (*CallMessage, CallHeader, error) {
	h, frag, err := ParseCallFrame(frame)
	if err != nil {
		a.reset()
		return nil, h, err
	}
	if a.open && (h.CallID != a.cur.CallID || h.Method != a.cur.Method || h.Status != a.cur.Status) {
		prev, n := a.cur, len(a.buf)+a.skipped
		a.reset()
		return nil, prev, fmt.Errorf("%w: call %d (method %d) ended after %d bytes without its last frame: a frame of call %d (method %d) came instead",
			ErrCallFrame, prev.CallID, prev.Method, n, h.CallID, h.Method)
	}
	if !a.open {
		a.cur, a.open, a.skipped = h, true, 0
		a.cur.Flags = 0
		a.buf = a.buf[:0]
		// A buffer grown for a large message is not kept for the small ones that usually follow.
		// Up to 1 MiB is kept: a 32k-token prompt sent packed is 256 KiB and a bit, and with a
		// bound at 256 KiB its buffer was dropped and regrown (about 1 MiB of garbage) every call.
		if cap(a.buf) > maxKeptAssemblyBytes {
			a.buf = nil
		}
	}
	switch {
	case a.skipped > 0:
		a.skipped += len(frag)
	case len(a.buf)+len(frag) > a.max:
		a.skipped = len(a.buf) + len(frag)
		a.buf = a.buf[:0]
	default:
		a.buf = append(a.buf, frag...)
	}
	if h.Flags&CallFrameMore != 0 {
		return nil, a.cur, nil
	}
	a.open = false
	if a.skipped > 0 {
		n := a.skipped
		a.skipped = 0
		return nil, a.cur, &CallMessageTooLargeError{Bytes: n, Limit: a.max}
	}
	return &CallMessage{Header: a.cur, Body: a.buf}, a.cur, nil
}

// Pending reports whether a message is partly joined.
func (a *CallAssembler) Pending() bool { return a.open }

func (a *CallAssembler) reset() { a.open, a.skipped, a.buf = false, 0, a.buf[:0] }

// callMethods maps each method a call channel carries to its gRPC full method name.
var callMethods = map[enginepb.CallChannelMethod]string{
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REGISTER:                 enginepb.Engine_Register_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_UNREGISTER:               enginepb.Engine_Unregister_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_LOOKUP:                   enginepb.Engine_Lookup_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_ADMISSION_QUERY:          enginepb.Engine_AdmissionQuery_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_CANCEL_LOAD:              enginepb.Engine_CancelLoad_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_UPDATE_STATE_AFTER_ALLOC: enginepb.Engine_UpdateStateAfterAlloc_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_BUILD_META:               enginepb.Engine_BuildMeta_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REQUEST_FINISHED:         enginepb.Engine_RequestFinished_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REQUEST_RESET:            enginepb.Engine_RequestReset_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_BIND_META:                enginepb.Engine_BindMeta_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_START_LOAD:               enginepb.Engine_StartLoad_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_WAIT_FOR_SAVE:            enginepb.Engine_WaitForSave_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_GET_FINISHED:             enginepb.Engine_GetFinished_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_TAKE_FAILED_LOADS:        enginepb.Engine_TakeFailedLoads_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_TAKE_FAILED_ASYNC_LOADS:  enginepb.Engine_TakeFailedAsyncLoads_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_TAKE_SUBMITTED_SAVES:     enginepb.Engine_TakeSubmittedSaves_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_DROP_BOUND_SAVES:         enginepb.Engine_DropBoundSaves_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_REGISTER_PROMPT_ARENA:    enginepb.Engine_RegisterPromptArena_FullMethodName,
	enginepb.CallChannelMethod_CALL_CHANNEL_METHOD_ATTACH_SCHEDULER:         enginepb.Engine_AttachScheduler_FullMethodName,
}

// callMethodOf is callMethods inverted.
var callMethodOf = func() map[string]enginepb.CallChannelMethod {
	out := make(map[string]enginepb.CallChannelMethod, len(callMethods))
	for m, name := range callMethods {
		out[name] = m
	}
	return out
}()

// CallMethodName is the gRPC full method name of a channel's method number, "" for a number no
// method has.
func CallMethodName(m enginepb.CallChannelMethod) string { return callMethods[m] }

// CallMethodOf is the channel's number of a gRPC full method name; false for a method channels
// do not carry (OpenCallChannel, or a name the service does not have).
func CallMethodOf(fullMethod string) (enginepb.CallChannelMethod, bool) {
	m, ok := callMethodOf[fullMethod]
	return m, ok
}
