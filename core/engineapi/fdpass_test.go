package engineapi

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketPair returns the two ends of a unix stream socket pair as *net.UnixConn.
func socketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// FuzzRecvFD sends the side channel what a hostile peer might: any bytes, with none, one or
// several descriptors attached. recvFD must return a file or an error, never panic, and keep at
// most one descriptor (the others are closed, so a peer cannot fill the daemon's file table
// through one message).
func FuzzRecvFD(f *testing.F) {
	f.Add([]byte{0}, uint8(1))
	f.Add([]byte{}, uint8(0))
	f.Add([]byte("hello"), uint8(5))
	f.Fuzz(func(t *testing.T, data []byte, nfds uint8) {
		a, b := socketPair(t)
		defer a.Close()
		defer b.Close()
		var fds []int
		for range int(nfds % 8) {
			fd, err := unix.MemfdCreate("fuzz", unix.MFD_CLOEXEC)
			if err != nil {
				t.Skip(err)
			}
			defer unix.Close(fd)
			fds = append(fds, fd)
		}
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		if len(data) == 0 && len(oob) == 0 {
			data = []byte{0}
		}
		_ = a.SetDeadline(time.Now().Add(2 * time.Second))
		if _, _, err := a.WriteMsgUnix(data, oob, nil); err != nil {
			t.Skip(err)
		}
		_ = b.SetDeadline(time.Now().Add(2 * time.Second))
		before := countFDs(t)
		file, err := recvFD(b)
		if err == nil {
			if file == nil {
				t.Fatal("no file and no error")
			}
			_ = file.Close()
		}
		if after := countFDs(t); after > before {
			t.Fatalf("%d descriptors left open by one message with %d attached", after-before, len(fds))
		}
	})
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return len(ents)
}

// TestRegistryExpiresOnTimer: an unclaimed descriptor is closed by the timer with no other
// traffic, and Claim refuses a token of the wrong length.
func TestRegistryExpiresOnTimer(t *testing.T) {
	r := NewFDRegistryWith(FDRegistryOptions{TTL: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: dir + "/fd", Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.Serve(ctx, l) }()
	fd, err := unix.MemfdCreate("ttl", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skip(err)
	}
	defer unix.Close(fd)
	if _, err := SendFD(ctx, dir+"/fd", fd); err != nil {
		t.Fatal(err)
	}
	if r.Held() != 1 {
		t.Fatalf("held %d, want 1", r.Held())
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.Held() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r.Held() != 0 {
		t.Error("the unclaimed descriptor outlived its TTL with nothing else arriving")
	}
	if _, err := r.Claim("short"); err == nil {
		t.Error("a short token was accepted")
	}
}
