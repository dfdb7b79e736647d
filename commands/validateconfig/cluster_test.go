package validateconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMooncakeBackendServeConfig checks a serve config of the mooncake backend together with
// the TensorRT-LLM mooncake.json it names.
func TestMooncakeBackendServeConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tcp := write("tcp.json", `{"master_server_address": "10.0.0.5:50051", "metadata_server": "http://10.0.0.5:8080/metadata", "protocol": "tcp", "global_segment_size": 1073741824, "local_buffer_size": 16777216}`)
	rdma := write("rdma.json", `{"master_server_address": "10.0.0.5:50051", "metadata_server": "P2PHANDSHAKE", "protocol": "rdma", "device_name": "mlx5_0"}`)

	good := write("good.yaml", "pool-backend: mooncake\nmooncake-config: "+tcp+"\n")
	out, _, code := run(t, &Options{Files: []string{good}, OutputFormat: "json"})
	if code != 0 {
		t.Fatalf("good: exit %d\n%s", code, out)
	}

	bad := write("bad.yaml", "pool-backend: mooncake\nmooncake-config: "+rdma+"\n")
	out, _, code = run(t, &Options{Files: []string{bad}, OutputFormat: "json"})
	if code != 3 || !strings.Contains(out, `protocol \"rdma\" is not supported`) || !strings.Contains(out, "P2PHANDSHAKE metadata is not supported") {
		t.Fatalf("rdma mooncake.json: exit %d\n%s", code, out)
	}

	// Keys alone: a master without a metadata server is refused, once.
	nometa := write("nometa.yaml", "pool-backend: mooncake\nmaster: 10.0.0.5:50051\n")
	out, _, code = run(t, &Options{Files: []string{nometa}, OutputFormat: "json"})
	if code != 3 || strings.Count(out, "needs the metadata server") != 1 {
		t.Fatalf("no metadata: exit %d\n%s", code, out)
	}
	badmaster := write("badmaster.yaml", "pool-backend: mooncake\nmaster: 10.0.0.5\nmetadata: http://10.0.0.5:8080/metadata\n")
	out, _, code = run(t, &Options{Files: []string{badmaster}, OutputFormat: "json"})
	if code != 3 || strings.Count(out, "is not host:port") != 1 {
		t.Fatalf("bad master: exit %d\n%s", code, out)
	}
}
