package adversarial

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/engineapi"
)

// runRole runs one flooder (this test binary re-run with ADVERSARIAL_ROLE set, possibly as
// another uid) and prints one line of counts. Every role stops after COUNT or DURATION.
func runRole(role string) int {
	env := func(k string) string { return os.Getenv(k) }
	count, _ := strconv.Atoi(env("COUNT"))
	dur, _ := time.ParseDuration(env("DURATION"))
	switch role {
	case "flood-conns":
		// Open COUNT idle connections to NETWORK ADDR and hold them DURATION.
		opened, failed := floodConns(env("NETWORK"), env("ADDR"), count, dur)
		fmt.Printf("opened=%d failed=%d\n", opened, failed)
		return 0
	case "flood-fds":
		// Send COUNT descriptors to the side channel at ADDR and never claim them.
		ok, refused, first := floodFDs(env("ADDR"), count)
		fmt.Printf("sent=%d refused=%d first=%q\n", ok, refused, first)
		if dur > 0 {
			time.Sleep(dur)
			ok2, refused2, _ := floodFDs(env("ADDR"), 1)
			fmt.Printf("after=%d refused_after=%d\n", ok2, refused2)
		}
		return 0
	case "flood-keepalive":
		// Open COUNT HTTP keep-alive connections to ADDR, make one request on each, and keep
		// them idle for DURATION, refreshing each with a request every REFRESH.
		refresh, _ := time.ParseDuration(env("REFRESH"))
		opened, failed := floodKeepAlive(env("ADDR"), count, dur, refresh)
		fmt.Printf("opened=%d failed=%d\n", opened, failed)
		return 0
	case "plant":
		// Listen on SOCKET (and SOCKET.fd) for DURATION as a planted daemon would; see plant.
		return plant(env("DIR"), env("SOCKET"), dur)
	case "query-loop":
		// GET URL in a loop for DURATION.
		codes := map[int]int{}
		c := &http.Client{Timeout: 5 * time.Second}
		for end := time.Now().Add(dur); time.Now().Before(end); {
			resp, err := c.Get(env("URL"))
			if err != nil {
				codes[-1]++
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[resp.StatusCode]++
		}
		fmt.Printf("200=%d 403=%d 429=%d err=%d\n", codes[200], codes[403], codes[429], codes[-1])
		return 0
	}
	fmt.Fprintln(os.Stderr, errRole, role)
	return 2
}

// floodConns opens up to count connections and holds them for hold; a connection the daemon
// closes is not reopened.
func floodConns(network, addr string, count int, hold time.Duration) (opened, failed int) {
	raiseOwnLimit()
	conns := make([]net.Conn, 0, count)
	for range count {
		c, err := net.DialTimeout(network, addr, 2*time.Second)
		if err != nil {
			failed++
			continue
		}
		conns = append(conns, c)
		opened++
	}
	time.Sleep(hold)
	for _, c := range conns {
		_ = c.Close()
	}
	return opened, failed
}

// floodFDs sends count shared-memory descriptors over the side channel.
func floodFDs(path string, count int) (sent, refused int, first string) {
	fd, err := unix.MemfdCreate("flood", unix.MFD_CLOEXEC)
	if err != nil {
		return 0, count, err.Error()
	}
	defer unix.Close(fd)
	for range count {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := rawSendFD(ctx, path, fd)
		cancel()
		if err != nil {
			refused++
			if first == "" {
				first = err.Error()
			}
			continue
		}
		sent++
	}
	return sent, refused, first
}

func raiseOwnLimit() {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &rl)
	}
}

// rawSendFD sends a descriptor to the side channel at path the way an attacker's own code
// would: without the checks engineapi.SendFD makes of whom it sends to.
func rawSendFD(ctx context.Context, path string, fd int) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return "", err
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	}
	if _, _, err := uc.WriteMsgUnix([]byte{0}, unix.UnixRights(fd), nil); err != nil {
		return "", err
	}
	reply := make([]byte, 256)
	n, err := uc.Read(reply)
	if err != nil {
		return "", err
	}
	if s := string(reply[:n]); len(s) != 2*engineapi.TokenSize {
		return "", fmt.Errorf("descriptor channel: %s", s)
	}
	return string(reply[:n]), nil
}
