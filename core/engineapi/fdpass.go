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
	// DefaultMaxHeldFDsPerUID caps the unclaimed descriptors of all processes of one uid, so
	// that many short-lived processes of one user cannot fill the registry either.
	DefaultMaxHeldFDsPerUID = 64
	// DefaultHeldFDTTL is how long an unclaimed descriptor is kept. An engine registers right
	// after sending its descriptor; a token older than this is abandoned.
	DefaultHeldFDTTL = 30 * time.Second
	// SendFDTimeout bounds SendFD's exchange when its context has no deadline.
	SendFDTimeout = 10 * time.Second
	// fdHandshakeTimeout bounds one side-channel connection.
	fdHandshakeTimeout = 10 * time.Second
)

// FDRegistryOptions bounds an FDRegistry. Zero values take the defaults.
type FDRegistryOptions struct {
	MaxHeld        int
	MaxHeldPerPeer int
	MaxHeldPerUID  int
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
	uid  int64 // the sender's uid, -1 when unknown
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
	if opts.MaxHeldPerUID <= 0 {
		opts.MaxHeldPerUID = DefaultMaxHeldFDsPerUID
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
	uid := int64(-1)
	if raw, err := uc.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				pid, uid = cred.Pid, int64(cred.Uid)
			}
		})
	}
	f, err := recvFD(uc)
	if err != nil {
		_, _ = c.Write([]byte("error: " + err.Error()))
		return
	}
	tok, err := r.put(f, pid, uid)
	if err != nil {
		_ = f.Close()
		_, _ = c.Write([]byte("error: " + err.Error()))
		return
	}
	_, _ = c.Write([]byte(tok))
}

func (r *FDRegistry) put(f *os.File, peer int32, uid int64) (string, error) {
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
	byPeer, byUID := 0, 0
	for _, h := range r.held {
		if peer != 0 && h.peer == peer {
			byPeer++
		}
		if uid >= 0 && h.uid == uid {
			byUID++
		}
	}
	if byPeer >= r.opts.MaxHeldPerPeer {
		return "", fmt.Errorf("process %d holds %d unclaimed descriptors, the most one process may; register with them or wait %v for them to expire", peer, byPeer, r.opts.TTL)
	}
	if byUID >= r.opts.MaxHeldPerUID {
		return "", fmt.Errorf("the processes of uid %d hold %d unclaimed descriptors, the most one uid may; register with them or wait %v for them to expire", uid, byUID, r.opts.TTL)
	}
	r.held[tok] = heldFD{file: f, at: r.now(), peer: peer, uid: uid}
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

// Release closes the descriptor stored under token, if any: the call that named it was refused,
// and its slot is free at once instead of after the TTL.
func (r *FDRegistry) Release(token string) {
	r.mu.Lock()
	h, ok := r.held[token]
	delete(r.held, token)
	r.mu.Unlock()
	if ok {
		_ = h.file.Close()
	}
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
// token that names it in Register. fd stays the caller's. It is SendFDTrust with the engine's
// own uid (and root) as the only daemon it trusts.
func SendFD(ctx context.Context, path string, fd int) (string, error) {
	return SendFDTrust(ctx, path, fd, DaemonTrust{})
}

// SendFDTrust is SendFD for a daemon trusted as t says. Before anything is sent it checks the
// socket's directory and file (checkDaemonPath) and the listener's SO_PEERCRED uid, and refuses
// with ErrUntrustedDaemon what another user could have planted. Without a deadline in ctx the
// exchange is bounded by SendFDTimeout, so a listener that accepts and never answers fails it.
func SendFDTrust(ctx context.Context, path string, fd int, t DaemonTrust) (string, error) {
	if err := checkDaemonPath(path, t); err != nil {
		return "", err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, SendFDTimeout)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return "", fmt.Errorf("descriptor channel %s: %w", path, err)
	}
	defer conn.Close()
	uc := conn.(*net.UnixConn)
	if err = checkDaemonPeer(uc, path, t); err != nil {
		return "", err
	}
	dl, _ := ctx.Deadline()
	_ = uc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = uc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	rights := unix.UnixRights(fd)
	if _, _, err = uc.WriteMsgUnix([]byte{0}, rights, nil); err != nil {
		return "", fmt.Errorf("send descriptor: %w", err)
	}
	reply := make([]byte, 256)
	n, err := uc.Read(reply)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return "", fmt.Errorf("descriptor channel %s accepted the descriptor but did not answer in time (is kvctl serve hung, or is something else listening there?): %w", path, context.DeadlineExceeded)
		}
		return "", fmt.Errorf("descriptor channel reply: %w", err)
	}
	s := string(reply[:n])
	if len(s) != 2*TokenSize {
		return "", fmt.Errorf("descriptor channel: %s", s)
	}
	return s, nil
}
