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

// maxHeldFDs caps the descriptors the registry keeps before they are claimed, so a client that
// sends descriptors and never registers cannot exhaust the daemon's file table.
const maxHeldFDs = 256

// heldFDTTL is how long an unclaimed descriptor is kept.
const heldFDTTL = 2 * time.Minute

// FDRegistry receives file descriptors over a unix socket side channel (SCM_RIGHTS) and keeps
// each under a random token until a Register call claims it. gRPC cannot carry descriptors, so
// an engine first sends its memory descriptor here, gets the token back, and names the token in
// Register.
type FDRegistry struct {
	mu   sync.Mutex
	held map[string]heldFD
	now  func() time.Time
}

type heldFD struct {
	file *os.File
	at   time.Time
}

// NewFDRegistry returns an empty registry.
func NewFDRegistry() *FDRegistry {
	return &FDRegistry{held: map[string]heldFD{}, now: time.Now}
}

// Serve accepts connections on l until ctx is done. Each connection carries one descriptor and
// gets the token back as 32 hex characters.
func (r *FDRegistry) Serve(ctx context.Context, l *net.UnixListener) error {
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	for {
		c, err := l.AcceptUnix()
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

func (r *FDRegistry) handle(c *net.UnixConn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	f, err := recvFD(c)
	if err != nil {
		_, _ = c.Write([]byte("error: " + err.Error()))
		return
	}
	tok, err := r.put(f)
	if err != nil {
		_ = f.Close()
		_, _ = c.Write([]byte("error: " + err.Error()))
		return
	}
	_, _ = c.Write([]byte(tok))
}

func (r *FDRegistry) put(f *os.File) (string, error) {
	var b [TokenSize]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b[:])
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked()
	if len(r.held) >= maxHeldFDs {
		return "", fmt.Errorf("too many unclaimed descriptors (%d)", maxHeldFDs)
	}
	r.held[tok] = heldFD{file: f, at: r.now()}
	return tok, nil
}

func (r *FDRegistry) expireLocked() {
	now := r.now()
	for t, h := range r.held {
		if now.Sub(h.at) > heldFDTTL {
			_ = h.file.Close()
			delete(r.held, t)
		}
	}
}

// Claim hands over the descriptor stored under token; the caller owns the file afterwards.
func (r *FDRegistry) Claim(token string) (*os.File, error) {
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
