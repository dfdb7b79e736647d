package mooncaketest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// listenedOn returns those of ports on which some process holds a listening TCP socket. After
// the master has exited, each of them is another process's, the likely reason it could not
// start.
func listenedOn(ports []int) ([]int, error) {
	inodes, err := listenerInodes()
	if err != nil {
		return nil, err
	}
	var held []int
	for _, p := range ports {
		if len(inodes[p]) > 0 {
			held = append(held, p)
		}
	}
	return held, nil
}

// listenerInodes maps each port with a listening TCP socket to the inodes of its listeners.
func listenerInodes() (map[int]map[string]bool, error) {
	inodes := map[int]map[string]bool{}
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(name)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		err = listeners(f, inodes)
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return inodes, nil
}

// notListening returns those of ports on which process pid holds no listening TCP socket. It
// reads /proc/net/tcp{,6} for the listeners' socket inodes and /proc/PID/fd for the process's
// sockets; where /proc is absent (not Linux) it cannot tell and returns none.
func notListening(pid int, ports []int) ([]int, error) {
	inodes, err := listenerInodes() // port -> inodes of its listeners
	if err != nil {
		return nil, err
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if os.IsNotExist(err) && len(inodes) == 0 {
		return nil, nil // no /proc
	}
	if err != nil {
		// The process exited (or /proc/PID is unreadable): it holds nothing.
		return ports, nil
	}
	owned := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err != nil {
			continue // closed since the listing
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			owned[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var missing []int
	for _, p := range ports {
		held := false
		for ino := range inodes[p] {
			held = held || owned[ino]
		}
		if !held {
			missing = append(missing, p)
		}
	}
	return missing, nil
}

// listeners adds the listening sockets of one /proc/net/tcp-format table to byPort.
func listeners(f *os.File, byPort map[int]map[string]bool) error {
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" { // 0A: TCP_LISTEN
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if !ok {
			return fmt.Errorf("local address %q has no port", fields[1])
		}
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil {
			return fmt.Errorf("local address %q: %w", fields[1], err)
		}
		if byPort[int(port)] == nil {
			byPort[int(port)] = map[string]bool{}
		}
		byPort[int(port)][fields[9]] = true
	}
	return sc.Err()
}

// RPCConns counts the TCP connections process pid holds open to the master's RPC port: its
// established sockets whose remote end is that port (read from /proc/net/tcp{,6} and
// /proc/PID/fd). Tests use it to check how many connections a client keeps.
func (m *Master) RPCConns(pid int) (int, error) {
	_, p, err := net.SplitHostPort(m.RPCAddr)
	if err != nil {
		return 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return 0, err
	}
	toPort := map[string]bool{} // inodes of established sockets to the port
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		table, rerr := os.ReadFile(name)
		if os.IsNotExist(rerr) {
			continue
		}
		if rerr != nil {
			return 0, rerr
		}
		for i, line := range strings.Split(string(table), "\n") {
			// sl local_address rem_address st ... inode
			fields := strings.Fields(line)
			if i == 0 || len(fields) < 10 || fields[3] != "01" { // 01: TCP_ESTABLISHED
				continue
			}
			_, hexPort, ok := strings.Cut(fields[2], ":")
			if !ok {
				return 0, fmt.Errorf("%s: remote address %q has no port", name, fields[2])
			}
			if rp, perr := strconv.ParseUint(hexPort, 16, 16); perr == nil && int(rp) == port {
				toPort[fields[9]] = true
			}
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err != nil {
			continue // closed since the listing
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok && toPort[strings.TrimSuffix(ino, "]")] {
			n++
		}
	}
	return n, nil
}
