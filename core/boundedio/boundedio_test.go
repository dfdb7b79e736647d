package boundedio

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestReadFileLimits(t *testing.T) {
	dir := t.TempDir()
	exact := filepath.Join(dir, "exact")
	over := filepath.Join(dir, "over")
	if err := os.WriteFile(exact, bytes.Repeat([]byte("a"), 100), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(over, bytes.Repeat([]byte("a"), 101), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if b, err := ReadFile(ctx, exact, 100); err != nil || len(b) != 100 {
		t.Errorf("a file of exactly the limit: %d bytes, %v", len(b), err)
	}
	if _, err := ReadFile(ctx, over, 100); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a file one byte over the limit: %v, want ErrTooLarge", err)
	}
	if _, err := ReadFile(ctx, dir, 100); err == nil {
		t.Error("a directory was read")
	}
	if _, err := ReadFile(ctx, filepath.Join(dir, "missing"), 100); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v, want ErrNotExist", err)
	}
}

// TestReadFileDevZero is the file stat calls empty that never ends: the limit stops it.
func TestReadFileDevZero(t *testing.T) {
	b, err := ReadFile(context.Background(), "/dev/zero", 1<<20)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("/dev/zero: %d bytes, %v; want ErrTooLarge", len(b), err)
	}
}

// TestReadFileFIFO: a FIFO with no writer does not block the open, and a FIFO whose writer
// sends nothing is interrupted by the context.
func TestReadFileFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadFile(context.Background(), fifo, 1<<20); done <- err }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("reading a FIFO without a writer blocked")
	}

	// A writer that holds the FIFO open and writes nothing. It is opened before the reader
	// (O_RDWR does not wait for a reader on Linux): opened after, it could block forever behind
	// a reader that had already seen end of file and gone.
	w, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, err := ReadFile(ctx, fifo, 1<<20); done <- err }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("interrupted read: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelling the context did not interrupt a blocked FIFO read")
	}
}

// FuzzReader checks the limit holds for any chunking: never more than limit bytes come back, and
// ErrTooLarge exactly when the input is longer.
func FuzzReader(f *testing.F) {
	f.Add([]byte("hello"), int64(3))
	f.Add([]byte(""), int64(0))
	f.Add(bytes.Repeat([]byte("x"), 4096), int64(4096))
	f.Fuzz(func(t *testing.T, data []byte, limit int64) {
		if limit < 0 || limit > 1<<16 {
			return
		}
		r := NewReader(context.Background(), bytes.NewReader(data), "fuzz", limit)
		var got []byte
		buf := make([]byte, 7)
		var err error
		for {
			var n int
			n, err = r.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				break
			}
		}
		if int64(len(got)) > limit {
			t.Fatalf("read %d bytes through a limit of %d", len(got), limit)
		}
		if over := int64(len(data)) > limit; over != errors.Is(err, ErrTooLarge) {
			t.Fatalf("%d bytes, limit %d: err %v", len(data), limit, err)
		}
		if !bytes.Equal(got, data[:len(got)]) {
			t.Fatal("bytes changed")
		}
	})
}
