package config

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMemoryWarnings pins when serve warns about memory: only when the pool cannot fit in
// what the process may take, or a chosen pool eats the engines' reserve on a GPU node.
func TestMemoryWarnings(t *testing.T) {
	const gb = 1 << 30
	tests := []struct {
		name   string
		pool   int64
		avail  uint64
		gpus   int
		chosen bool
		source string
		want   string // "" for no warning
	}{
		{"workstation, automatic size", 5 * gb, 22 * gb, 0, false, "", ""},
		{"workstation, chosen size that fits, no GPU", 8 * gb, 22 * gb, 0, true, "", ""},
		{"GPU node, chosen size inside the budget", 64 * gb, 500 * gb, 8, true, "", ""},
		{"GPU node, chosen size eating the reserve", 480 * gb, 500 * gb, 8, true, "", "node memory budget"},
		{"larger than a container's limit", 16 * gb, 4 * gb, 0, true, "cgroup v2 limit of /sys/fs/cgroup", "larger than the memory this process may take"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := memoryWarnings(tt.pool, 256<<20, tt.avail, tt.source, tt.gpus, tt.chosen)
			if tt.want == "" {
				if len(ws) != 0 {
					t.Fatalf("warned %q, want nothing", ws[0].Msg)
				}
				return
			}
			if len(ws) != 1 || !strings.Contains(ws[0].Msg, tt.want) {
				t.Fatalf("warnings %+v, want one saying %q", ws, tt.want)
			}
			for i := 1; i < len(ws[0].Args); i += 2 {
				v, _ := ws[0].Args[i].(string)
				key := ws[0].Args[i-1].(string)
				if key != "available_from" && !strings.HasSuffix(v, "iB") {
					t.Errorf("%s = %q, want a binary unit", key, v)
				}
			}
		})
	}
}

// TestResolveServe pins the one resolution of a serve config that serve and validate-config
// share: sizes, the minimum, the automatic size, and a mooncake.json's protocol.
func TestResolveServe(t *testing.T) {
	mem := func(n uint64, known bool) func() (uint64, bool) { return func() (uint64, bool) { return n, known } }
	files := map[string]string{
		"rdma.json": `{"local_hostname": "h", "metadata_server": "http://10.0.0.5:8080/metadata", "global_segment_size": "4GiB",
			"local_buffer_size": "16MiB", "protocol": "rdma", "device_name": "mlx5_0", "master_server_address": "10.0.0.5:50051"}`,
		"tcp.json": `{"local_hostname": "h", "metadata_server": "http://10.0.0.5:8080/metadata", "global_segment_size": "4GiB",
			"local_buffer_size": "16MiB", "protocol": "tcp", "device_name": "", "master_server_address": "10.0.0.5:50051"}`,
	}
	read := func(p string) ([]byte, error) { return []byte(files[p]), nil }
	tests := []struct {
		name      string
		edit      func(*ServeConfig)
		mem       func() (uint64, bool)
		wantBytes int64
		wantAuto  bool
		wantErr   string // "" when the plan must be valid
	}{
		{"chosen size", func(s *ServeConfig) { s.PoolSize = "64MiB" }, nil, 64 << 20, false, ""},
		{"below the minimum", func(s *ServeConfig) { s.PoolSize = "1MiB" }, nil, 0, false, "pool-size 1MiB is below the 16MiB minimum pool"},
		{"below the minimum, known memory", func(s *ServeConfig) { s.PoolSize = "1MiB" }, mem(64<<30, true), 0, false, "below the 16MiB minimum"},
		{"decimal unit refused", func(s *ServeConfig) { s.PoolSize = "64GB" }, nil, 0, false, "1024-based"},
		{"auto, memory not read", func(s *ServeConfig) {}, nil, 0, false, ""},
		{"auto, known memory", func(s *ServeConfig) {}, mem(8<<30, true), 2 << 30, true, ""},
		{"auto, unknown memory", func(s *ServeConfig) {}, mem(0, false), 0, false, "available memory is unknown"},
		{"auto, tiny machine", func(s *ServeConfig) {}, mem(32<<20, true), 0, true, "below the 16MiB minimum"},
		{"mooncake.json with rdma", func(s *ServeConfig) {
			s.PoolBackend, s.MooncakeConfig = PoolBackendMooncake, "rdma.json"
		}, nil, 4 << 30, false, `protocol "rdma" is not supported`},
		{"mooncake.json with tcp", func(s *ServeConfig) {
			s.PoolBackend, s.MooncakeConfig = PoolBackendMooncake, "tcp.json"
		}, nil, 4 << 30, false, ""},
		{"mooncake segment below the minimum", func(s *ServeConfig) {
			s.PoolBackend, s.MooncakeConfig, s.PoolSize = PoolBackendMooncake, "tcp.json", "8MiB"
		}, nil, 0, false, "below the 16MiB minimum segment"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := DefaultServeConfig()
			tt.edit(&s)
			p, diags := s.Resolve(ResolveOptions{ReadFile: read, MemAvailable: tt.mem})
			if tt.wantErr != "" {
				if !diags.HasErrors() || !strings.Contains(diags.Errors()[0].String()+allMessages(diags), tt.wantErr) {
					t.Fatalf("diagnostics %v, want an error saying %q", diags, tt.wantErr)
				}
				return
			}
			if diags.HasErrors() {
				t.Fatalf("diagnostics %v, want none", diags)
			}
			if p.PoolBytes != tt.wantBytes || p.AutoSized != tt.wantAuto {
				t.Errorf("pool %d auto %v, want %d auto %v", p.PoolBytes, p.AutoSized, tt.wantBytes, tt.wantAuto)
			}
		})
	}
}

func allMessages(d Diagnostics) string {
	var b strings.Builder
	for _, x := range d {
		b.WriteString(x.String() + "\n")
	}
	return b.String()
}

func TestFormatSizeHuman(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 512: "512B", 1536: "1.5KiB", 1536 << 20: "1.5GiB", 64 << 30: "64.0GiB"} {
		if got := FormatSizeHuman(n); got != want {
			t.Errorf("FormatSizeHuman(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestFormatBytes pins the one human size formatter in its two uses: the status page's and log
// lines' "1.5GiB" and kvctl stats' "64.00 MiB".
func TestFormatBytes(t *testing.T) {
	for _, c := range []struct {
		n    int64
		dec  int
		sep  string
		want string
	}{
		{512, 1, "", "512B"}, {1536 << 20, 1, "", "1.5GiB"}, {64 << 20, 2, " ", "64.00 MiB"},
		{0, 2, " ", "0 B"}, {1023, 2, " ", "1023 B"}, {5 << 40, 2, " ", "5.00 TiB"},
	} {
		if got := FormatBytes(c.n, c.dec, c.sep); got != c.want {
			t.Errorf("FormatBytes(%d, %d, %q) = %q, want %q", c.n, c.dec, c.sep, got, c.want)
		}
	}
	if FormatSizeFloor(7<<30+5) != "7GiB" || FormatSizeFloor(300<<20+1) != "300MiB" || FormatSizeFloor(4096) != "4KiB" {
		t.Errorf("FormatSizeFloor: %s %s %s", FormatSizeFloor(7<<30+5), FormatSizeFloor(300<<20+1), FormatSizeFloor(4096))
	}
}

// TestOneSizeFormatter checks that no package outside core/config carries its own table of
// binary size units, the mark of a second size parser or formatter (the Mooncake master's own
// "1.13 MB" summary format, which kvctl reproduces byte for byte, uses other names).
func TestOneSizeFormatter(t *testing.T) {
	units := regexp.MustCompile(`"(KiB|MiB|GiB|TiB)"\s*[,:]\s*"?(MiB|GiB|TiB|PiB|1)`)
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != "../.." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || filepath.Dir(path) == "../../core/config" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if units.Match(b) {
			t.Errorf("%s has a size unit table of its own: use config.ParseSize, FormatSize or FormatBytes", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
