package adversarial

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

// readyz returns the daemon's /readyz status and body.
func (p *serveProc) readyz(t *testing.T) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + p.admin + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// mooncakeArgs are serve's flags for the mooncake backend against master m with admin.
func mooncakeArgs(m *mooncaketest.Master, admin string) []string {
	return []string{"--pool-backend", "mooncake", "--master", m.RPCAddr, "--metadata", m.MetadataURL,
		"--master-admin", admin, "--pool-timeout", "2s", "--staging-buffer-bytes", "8MiB"}
}

// TestForeignMasterAdmin: attack 8. Two real masters; a daemon of master A given master B's
// admin server (another cluster's, reachable at the address it was told) refuses it: it never
// reports ready on B's say-so, and /readyz and the log name the mismatch. The same daemon with
// A's own admin server becomes ready.
func TestForeignMasterAdmin(t *testing.T) {
	a := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	b := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})

	// B is a live cluster with a segment of its own.
	other := startServe(t, serveOpts{args: mooncakeArgs(b, b.AdminURL)})
	waitReadyz(t, other, 200)

	p := startServe(t, serveOpts{args: mooncakeArgs(a, b.AdminURL)})
	waitLog(t, p, "serves another master")
	code, body := p.readyz(t)
	if code == 200 || !strings.Contains(body, "serves another master") {
		t.Errorf("/readyz with another master's admin server: %d %q, want 503 naming the foreign admin", code, body)
	}
	p.alive(t)
	// Still refused on the next mount attempts.
	time.Sleep(3 * time.Second)
	if code, body := p.readyz(t); code == 200 {
		t.Errorf("/readyz became ready with another master's admin server: %q", body)
	}

	own := startServe(t, serveOpts{args: mooncakeArgs(a, a.AdminURL)})
	waitReadyz(t, own, 200)
	if strings.Contains(own.stderr.String(), "another master") {
		t.Errorf("the master's own admin server was refused:\n%s", tail(own.stderr.String(), 20))
	}
}

// waitReadyz waits until /readyz answers want.
func waitReadyz(t *testing.T, p *serveProc, want int) {
	t.Helper()
	var code int
	var body string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		p.alive(t)
		if code, body = p.readyz(t); code == want {
			return
		}
	}
	t.Fatalf("/readyz: %d %q, want %d\n%s", code, body, want, tail(p.stderr.String(), 30))
}
