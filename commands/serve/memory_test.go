package serve

import (
	"strings"
	"testing"
)

// TestMemoryWarnings pins when serve warns about memory: only when the pool cannot fit in
// what the process may take, or a chosen pool eats the engines' reserve on a GPU node; always
// in GiB.
func TestMemoryWarnings(t *testing.T) {
	const gb = 1 << 30
	tests := []struct {
		name string
		c    memoryCheck
		want string // "" for no warning
	}{
		{"workstation, automatic size", memoryCheck{Pool: 5 * gb, Staging: 256 << 20, Avail: 22 * gb, Known: true, Chosen: false}, ""},
		{"workstation, chosen size that fits, no GPU", memoryCheck{Pool: 8 * gb, Staging: 256 << 20, Avail: 22 * gb, Known: true, Chosen: true}, ""},
		{"GPU node, chosen size inside the budget", memoryCheck{Pool: 64 * gb, Staging: 256 << 20, Avail: 500 * gb, Known: true, Chosen: true, GPUs: 8}, ""},
		{"GPU node, chosen size eating the reserve", memoryCheck{Pool: 480 * gb, Staging: 256 << 20, Avail: 500 * gb, Known: true, Chosen: true, GPUs: 8}, "node memory budget"},
		{"larger than a container's limit", memoryCheck{Pool: 16 * gb, Staging: 256 << 20, Avail: 4 * gb, Known: true, Chosen: true, Source: "cgroup v2 limit of /sys/fs/cgroup"}, "larger than the memory this process may take"},
		{"unknown memory", memoryCheck{Pool: 16 * gb, Known: false, Chosen: true, GPUs: 1}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := tt.c.warnings()
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
				if key != "available_from" && !strings.HasSuffix(v, " GiB") {
					t.Errorf("%s = %q, want GiB", key, v)
				}
			}
		})
	}
	if got := gib(1536 << 20); got != "1.5 GiB" {
		t.Errorf("gib(1.5 GiB) = %q", got)
	}
}
