package adversarial

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestExposureWarning: kvctl serve with the mooncake backend warns at start, naming the traffic
// and the address, when the Transfer Engine server (--host-address) or the metadata server is
// on a non-private address, and stays quiet when everything is on loopback. No master runs: the
// warning comes before the mount.
func TestExposureWarning(t *testing.T) {
	port := strconv.Itoa(freeTCPPort(t)) // nothing listens there
	base := []string{"--pool-backend", "mooncake", "--master", "127.0.0.1:" + port, "--pool-timeout", "1s"}
	const warning = "Mooncake traffic on a non-private address"

	public := startServe(t, serveOpts{args: append(base, "--host-address", "198.51.100.7",
		"--metadata", "http://203.0.113.5:8080/metadata")})
	waitLog(t, public, warning)
	for _, want := range []string{"198.51.100.7", "Transfer Engine server (--host-address)", "203.0.113.5", "HTTP metadata server (--metadata)"} {
		if !strings.Contains(public.stderr.String(), want) {
			t.Errorf("the warning does not name %q:\n%s", want, tail(public.stderr.String(), 20))
		}
	}

	private := startServe(t, serveOpts{args: append(base, "--host-address", "127.0.0.1",
		"--metadata", "http://127.0.0.1:"+port+"/metadata")})
	private.healthy(t)
	if strings.Contains(private.stderr.String(), warning) {
		t.Errorf("a warning with every address on loopback:\n%s", tail(private.stderr.String(), 20))
	}
}

// freeTCPPort returns a loopback port nothing listens on (it was free a moment ago).
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
