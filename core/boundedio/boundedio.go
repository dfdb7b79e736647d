package boundedio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// Limits kvctl reads with.
const (
	// MaxConfigBytes bounds a config file (kvctl's own, TensorRT-LLM's, a pool manifest).
	MaxConfigBytes = 16 << 20
	// MaxTraceBytes bounds a replay trace file or a tokens file it names.
	MaxTraceBytes = 4 << 30
)

// ErrIsDir is wrapped by the error of Open on a directory.
var ErrIsDir = errors.New("is a directory, not a file")

// ErrTooLarge is wrapped by the error of a read that went past its limit.
var ErrTooLarge = errors.New("file is larger than its limit")

// ReadFile reads the whole of path, failing with ErrTooLarge once more than limit bytes come
// and with ctx's error when ctx is done first.
func ReadFile(ctx context.Context, path string, limit int64) ([]byte, error) {
	rc, err := Open(ctx, path, limit)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// Open opens path for reading through limit and ctx. A FIFO is opened without blocking on a
// writer; closing the returned reader (or ctx ending) unblocks a read in progress.
func Open(ctx context.Context, path string, limit int64) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if fi.IsDir() {
		_ = f.Close()
		return nil, fmt.Errorf("%s %w", path, ErrIsDir)
	}
	return NewReader(ctx, f, path, limit), nil
}

// Reader reads through a byte limit and stops when its context is done.
type Reader struct {
	ctx   context.Context
	r     io.Reader
	c     io.Closer
	name  string
	limit int64
	n     int64

	stopWatch func() bool
	closeOnce sync.Once
	closeErr  error
}

// NewReader wraps r (closed with c when not nil) so that reading past limit bytes fails with
// ErrTooLarge naming name, and ctx ending closes c, which unblocks a pending read on a pipe or
// FIFO, and fails the read with ctx's error.
func NewReader(ctx context.Context, rc io.Reader, name string, limit int64) *Reader {
	r := &Reader{ctx: ctx, r: rc, name: name, limit: limit}
	if c, ok := rc.(io.Closer); ok {
		r.c = c
		// closeFile, not Close: the func may run before AfterFunc returns (ctx already done),
		// and must not read stopWatch.
		r.stopWatch = context.AfterFunc(ctx, r.closeFile)
	}
	return r
}

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, fmt.Errorf("reading %s: %w", r.name, err)
	}
	if r.n > r.limit {
		return 0, fmt.Errorf("%s: %w (%d bytes)", r.name, ErrTooLarge, r.limit)
	}
	// Read at most one byte past the limit, to tell "exactly the limit" from "more".
	if room := r.limit + 1 - r.n; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := r.r.Read(p)
	r.n += int64(n)
	if r.n > r.limit {
		return n - int(r.n-r.limit), fmt.Errorf("%s: %w (%d bytes)", r.name, ErrTooLarge, r.limit)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		if cerr := r.ctx.Err(); cerr != nil {
			return n, fmt.Errorf("reading %s: %w", r.name, cerr)
		}
	}
	return n, err
}

// Close closes the underlying file once.
func (r *Reader) Close() error {
	if r.stopWatch != nil {
		r.stopWatch()
	}
	r.closeFile()
	return r.closeErr
}

func (r *Reader) closeFile() {
	r.closeOnce.Do(func() {
		if r.c != nil {
			r.closeErr = r.c.Close()
		}
	})
}
