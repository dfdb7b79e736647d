package embedded

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// prefaultPiece is the unit prefault hands to a goroutine: a multiple of the 2 MiB huge page, so
// that no huge page is split between two goroutines.
const prefaultPiece = 64 << 20

// prefault makes mem resident, on up to workers goroutines. It asks the kernel to populate the
// pages for writing (MADV_POPULATE_WRITE, Linux 5.14) and, on a kernel without it, writes a zero
// into every page, which is what populating does to fresh anonymous memory.
func prefault(mem []byte, workers int) error {
	pieces := (len(mem) + prefaultPiece - 1) / prefaultPiece
	workers = max(1, min(workers, pieces))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < pieces; i += workers {
				p := mem[i*prefaultPiece : min((i+1)*prefaultPiece, len(mem))]
				if err := populate(p); err != nil {
					errs[w] = fmt.Errorf("prefault %d bytes at offset %d: %w", len(p), i*prefaultPiece, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func populate(p []byte) error {
	err := unix.Madvise(p, unix.MADV_POPULATE_WRITE)
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	// EINVAL: a kernel older than the advice (the range is valid, it is a whole mapping).
	for off := 0; off < len(p); off += os.Getpagesize() {
		p[off] = 0
	}
	return nil
}
