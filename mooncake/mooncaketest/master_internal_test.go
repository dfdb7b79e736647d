package mooncaketest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestMissingLibrary: a master that cannot load a shared library is told apart from one that
// fails otherwise, by the dynamic loader's line in its log.
func TestMissingLibrary(t *testing.T) {
	log := "=== start /x/bin/mooncake_master --rpc_port=1\n" +
		"/x/mooncake_master: error while loading shared libraries: libibverbs.so.1: cannot open shared object file: No such file or directory\n" +
		"=== killed\n"
	if got, want := missingLibrary(log), "error while loading shared libraries: libibverbs.so.1: cannot open shared object file: No such file or directory"; got != want {
		t.Fatalf("missingLibrary = %q, want %q", got, want)
	}
	if got := missingLibrary("=== start\nE1202 bind: address already in use\n=== killed\n"); got != "" {
		t.Fatalf("missingLibrary of a failure to bind = %q, want none", got)
	}
}

// TestNotListening: a listener is found as held by the process that holds it, and as not held
// by another process or when nothing listens, so a master whose port another process took is
// never taken for ready.
func TestNotListening(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp on this system: notListening cannot tell and reports none")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held := l.Addr().(*net.TCPAddr).Port
	free := FreePort(t)
	got, err := notListening(os.Getpid(), []int{held, free})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int{free}) {
		t.Fatalf("notListening(this process, [held %d, free %d]) = %v, want [%d]", held, free, got, free)
	}
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	if got, err := notListening(other.Process.Pid, []int{held}); err != nil || !slices.Equal(got, []int{held}) {
		t.Fatalf("notListening(another process, [%d]) = %v, %v; want [%d]", held, got, err, held)
	}
	if got, err := notListening(1<<22+7, []int{held}); err != nil || !slices.Equal(got, []int{held}) {
		t.Fatalf("notListening(no such process, [%d]) = %v, %v; want [%d]", held, got, err, held)
	}
}

// TestStartRefusesATakenPort: a real master started on an RPC port another process already
// listens on is not taken for ready, though that port accepts connections and the master's
// HTTP servers answer: start fails, naming the port, so StartMaster tries other ports.
func TestStartRefusesATakenPort(t *testing.T) {
	env := PyEnv(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	go func() {
		for {
			c, err := taken.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	rpc := taken.Addr().(*net.TCPAddr).Port
	ports, err := freePorts(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	m := &Master{t: t, bin: filepath.Join(env, "bin", "mooncake_master"), log: &lockedBuffer{}}
	m.RPCAddr = fmt.Sprintf("127.0.0.1:%d", rpc)
	m.MetadataURL = fmt.Sprintf("http://127.0.0.1:%d/metadata", ports[0])
	m.AdminURL = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	m.ports = []int{rpc, ports[0], ports[1]}
	m.args = []string{
		"--rpc_address=127.0.0.1", "--rpc_port=" + strconv.Itoa(rpc),
		"--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
		"--http_metadata_server_port=" + strconv.Itoa(ports[0]),
		"--metrics_host=127.0.0.1", "--metrics_port=" + strconv.Itoa(ports[1]),
		"--rpc_thread_num=2",
	}
	defer m.Kill()
	err = m.start(t.Context())
	if err == nil {
		t.Fatalf("start on a taken RPC port %d succeeded; log:\n%s", rpc, m.Log())
	}
	if !strings.Contains(err.Error(), strconv.Itoa(rpc)) {
		t.Fatalf("start on a taken RPC port = %v, want an error naming port %d", err, rpc)
	}
}
