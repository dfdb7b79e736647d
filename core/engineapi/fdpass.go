package engineapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// TokenSize is the size of the token that names a file descriptor handed over the side channel.
const TokenSize = 16

// Defaults of FDRegistryOptions.
const (
	// DefaultMaxHeldFDs caps the descriptors the registry keeps before they are claimed, so a
	// client that sends descriptors and never registers cannot exhaust the daemon's file table.
	DefaultMaxHeldFDs = 1024
	// DefaultMaxHeldFDsPerPeer caps the unclaimed descriptors of one sending process, so one
	// process cannot fill the registry and make every other engine's Register fail.
	DefaultMaxHeldFDsPerPeer = 16
	// DefaultHeldFDTTL is how long an unclaimed descriptor is kept. An engine registers right
	// after sending its descriptor; a token older than this is abandoned.
	DefaultHeldFDTTL = 30 * time.Second
	// fdHandshakeTimeout bounds one side-channel connection.
	fdHandshakeTimeout = 10 * time.Second
)

// FDRegistryOptions bounds an FDRegistry. Zero values take the defaults.
type FDRegistryOptions struct {
	MaxHeld        int
	MaxHeldPerPeer int
	TTL            time.Duration
}

// FDRegistry receives file descriptors over a unix socket side channel (SCM_RIGHTS) and keeps
// each under a random token until a Register call claims it. gRPC cannot carry descriptors, so
// an engine first sends its memory descriptor here, gets the token back, and names the token in
// Register. Unclaimed descriptors are closed by a timer once older than the TTL.
type FDRegistry struct {
	opts FDRegistryOptions
	mu   sync.Mutex
	held map[string]heldFD
	now  func() time.Time
}

type heldFD struct {
	file *os.File
	at   time.Time
	peer int32 // the sender's pid, 0 when unknown
}

// NewFDRegistry returns an empty registry with the default bounds.
func NewFDRegistry() *FDRegistry { return NewFDRegistryWith(FDRegistryOptions{}) }

// NewFDRegistryWith returns an empty registry with the bounds of opts.
func NewFDRegistryWith(opts FDRegistryOptions) *FDRegistry {
	if opts.MaxHeld <= 0 {
		opts.MaxHeld = DefaultMaxHeldFDs
	}
	if opts.MaxHeldPerPeer <= 0 {
		opts.MaxHeldPerPeer = DefaultMaxHeldFDsPerPeer
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultHeldFDTTL
	}
	return &FDRegistry{opts: opts, held: map[string]heldFD{}, now: time.Now}
}

// Held is the number of descriptors waiting to be claimed.
func (r *FDRegistry) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// Serve accepts connections on l until ctx is done. Each connection carries one descriptor and
// gets the token back as 32 hex characters. l's connections must be unix connections, or wrap
// one and return it from an Unwrap() net.Conn method. A timer closes unclaimed descriptors
// older than the TTL. A failing accept is the listener's to retry; Serve returns its error.
func (r *FDRegistry) Serve(ctx context.Context, l net.Listener) error {
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	go r.expireLoop(ctx)
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("fd channel: %w", err)
		}
		go r.handle(c)
	}
}

func (r *FDRegistry) expireLoop(ctx context.Context) {
	t := time.NewTicker(max(r.opts.TTL/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.mu.Lock()
			r.expireLocked()
			r.mu.Unlock()
		}
	}
}

func asUnixConn(c net.Conn) *net.UnixConn {
	for {
		switch v := c.(type) {
		case *net.UnixConn:
			return v
		case interface{ Unwrap() net.Conn }:
			c = v.Unwrap()
		default:
			return nil
		}
	}
}

func (r *FDRegistry) handle(c net.Conn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(fdHandshakeTimeout))
	uc := asUnixConn(c)
	if uc == nil {
		_, _ = c.Write([]byte("error: not a unix connection"))
		return
	}
	var pid int32
	if raw, err := uc.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				pid = cred.Pid
			}
		})
	}
	f, err := recvFD(uc)
	if err != nil {
		_, _ = c.Write([]byte("error: " + err.Error()))
		return
	}
	tok, err := r.put(f, pid)
	if err != nil {
		_ = f.Close()
		_, _ = c.Write([]byte("error: " + err.Error()))
		return
	}
	_, _ = c.Write([]byte(tok))
}

func (r *FDRegistry) put(f *os.File, peer int32) (string, error) {
	var b [TokenSize]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b[:])
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked()
	if len(r.held) >= r.opts.MaxHeld {
		return "", fmt.Errorf("too many unclaimed descriptors (%d); they expire after %v", r.opts.MaxHeld, r.opts.TTL)
	}
	if peer != 0 {
		n := 0
		for _, h := range r.held {
			if h.peer == peer {
				n++
			}
		}
		if n >= r.opts.MaxHeldPerPeer {
			return "", fmt.Errorf("process %d holds %d unclaimed descriptors, the most one process may; register with them or wait %v for them to expire", peer, n, r.opts.TTL)
		}
	}
	r.held[tok] = heldFD{file: f, at: r.now(), peer: peer}
	return tok, nil
}

func (r *FDRegistry) expireLocked() {
	now := r.now()
	for t, h := range r.held {
		if now.Sub(h.at) > r.opts.TTL {
			_ = h.file.Close()
			delete(r.held, t)
		}
	}
}

// Claim hands over the descriptor stored under token; the caller owns the file afterwards.
func (r *FDRegistry) Claim(token string) (*os.File, error) {
	if len(token) != 2*TokenSize {
		return nil, fmt.Errorf("descriptor token has %d characters, want %d", len(token), 2*TokenSize)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked()
	h, ok := r.held[token]
	if !ok {
		return nil, fmt.Errorf("unknown or expired descriptor token %q", token)
	}
	delete(r.held, token)
	return h.file, nil
}

// Close releases every unclaimed descriptor.
func (r *FDRegistry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t, h := range r.held {
		_ = h.file.Close()
		delete(r.held, t)
	}
}

func recvFD(c *net.UnixConn) (*os.File, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("read descriptor: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, fmt.Errorf("read descriptor: %w", err)
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for i, fd := range fds {
			if i == 0 {
				continue
			}
			_ = unix.Close(fd)
		}
		if len(fds) > 0 {
			return os.NewFile(uintptr(fds[0]), "engine-memory"), nil
		}
	}
	return nil, errors.New("no descriptor in the message")
}

// SendFD sends a copy of descriptor fd to the daemon's side channel at path and returns the
// token that names it in Register. fd stays the caller's.
func SendFD(ctx context.Context, path string, fd int) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return "", fmt.Errorf("descriptor channel %s: %w", path, err)
	}
	defer conn.Close()
	uc := conn.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	}
	rights := unix.UnixRights(fd)
	if _, _, err := uc.WriteMsgUnix([]byte{0}, rights, nil); err != nil {
		return "", fmt.Errorf("send descriptor: %w", err)
	}
	reply := make([]byte, 256)
	n, err := uc.Read(reply)
	if err != nil {
		return "", fmt.Errorf("descriptor channel reply: %w", err)
	}
	s := string(reply[:n])
	if len(s) != 2*TokenSize {
		return "", fmt.Errorf("descriptor channel: %s", s)
	}
	return s, nil
}
