package adversarial

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// serveExit runs kvctl serve expecting it to refuse to start; it returns the exit code and
// stderr.
func serveExit(t *testing.T, socket string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kvctl, append([]string{"serve", "--socket", socket, "--admin-addr", "127.0.0.1:0", "--pool-size", "32MiB"}, args...)...)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("kvctl serve: %v\n%s", err, out)
	}
	return 0, string(out)
}

// TestPlantedSocketDirectory: a socket directory another user could have planted (mode 0777, a
// symlink, or owned by another uid) is refused with a message that says what to fix, and no
// socket is created in it.
func TestPlantedSocketDirectory(t *testing.T) {
	base := socketDir(t)
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(open, 0o777)
	target := filepath.Join(base, "target")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, dir, want string
	}{
		{"world-writable", open, "chmod 700"},
		{"symlink", link, "is a symlink"},
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		if err := os.Mkdir(other, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, nobodyUID, nobodyUID); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct{ name, dir, want string }{"another uid's", other, "owned by uid 65534"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out := serveExit(t, filepath.Join(c.dir, "kvctl.sock"))
			if code != 1 && code != 3 {
				t.Errorf("exit %d, want a refusal\n%s", code, out)
			}
			if !strings.Contains(out, c.want) || !strings.Contains(out, "unsafe socket directory") {
				t.Errorf("message does not say what to fix (%q):\n%s", c.want, out)
			}
			if _, err := os.Lstat(filepath.Join(c.dir, "kvctl.sock.fd")); err == nil {
				t.Error("a socket was created in the planted directory")
			}
		})
	}
}

// TestPeerCredentials: a process of another uid that reaches the engine socket and the side
// channel is refused by SO_PEERCRED; naming its group with --engine-group admits it. The daemon
// runs as nobody and the test (root) is the other uid.
func TestPeerCredentials(t *testing.T) {
	requireRoot(t)
	dir := socketDir(t)
	if err := os.Chown(dir, nobodyUID, nobodyUID); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, serveOpts{uid: nobodyUID, dir: dir})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := engineapi.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Lookup(ctx, &enginepb.LookupRequest{Engine: "x", Request: &enginepb.Request{Id: "r"}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a call from another uid: %v, want Unavailable (connection refused)", err)
	}
	if _, err := rawSendFD(ctx, engineapi.FDSocketPath(p.socket), 0); err == nil {
		t.Error("the side channel took a descriptor from another uid")
	}
	waitLog(t, p, "is not the daemon's uid")
	p.healthy(t)

	// The operator admits root's group: the directory and sockets become group-accessible.
	dir2 := socketDir(t)
	if err := os.Chown(dir2, nobodyUID, 0); err != nil {
		t.Fatal(err)
	}
	// setgid: the sockets inherit the directory's group, which the daemon's user is not in.
	if err := os.Chmod(dir2, 0o750|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	p2 := startServe(t, serveOpts{uid: nobodyUID, dir: dir2, args: []string{"--engine-group", "0"}})
	c2, err := engineapi.Dial(p2.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, err = c2.Lookup(ctx, &enginepb.LookupRequest{Engine: "x", Request: &enginepb.Request{Id: "r"}})
	if status.Code(err) != codes.NotFound {
		t.Errorf("a call from a member of the engine group: %v, want NotFound (admitted, no such engine)", err)
	}
}

func waitLog(t *testing.T, p *serveProc, s string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if strings.Contains(p.stderr.String(), s) {
			return
		}
	}
	t.Errorf("the log never said %q:\n%s", s, tail(p.stderr.String(), 30))
}
