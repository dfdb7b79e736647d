package sysmem

import (
	"os"
	"strings"
	"testing"
	"testing/fstest"
)

const meminfo = "MemTotal:       65536000 kB\nMemFree:         1000000 kB\nMemAvailable:   32000000 kB\n"

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func TestRead(t *testing.T) {
	const gib = 1 << 30
	v2mount := "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
	v1mount := "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
		"32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
	tests := []struct {
		name      string
		fs        fstest.MapFS
		want      uint64
		version   int
		sourceHas string
	}{
		{"no cgroup files", fstest.MapFS{"proc/meminfo": file(meminfo)}, 32000000 * 1024, 0, "/proc/meminfo"},
		{"v2 limit in a container (cgroup namespace, path /)", fstest.MapFS{
			"proc/meminfo":                   file(meminfo),
			"proc/self/cgroup":               file("0::/\n"),
			"proc/self/mountinfo":            file(v2mount),
			"sys/fs/cgroup/memory.max":       file("8589934592\n"),
			"sys/fs/cgroup/memory.current":   file("3221225472\n"),
			"sys/fs/cgroup/memory.stat":      file("anon 1000\ninactive_file 1073741824\nactive_file 5\n"),
			"sys/fs/cgroup/cgroup.procs":     file("1\n"),
			"sys/fs/cgroup/cgroup.subtree_x": file(""),
		}, 8*gib - 2*gib, 2, "cgroup v2"},
		{"v2 unlimited", fstest.MapFS{
			"proc/meminfo":                            file(meminfo),
			"proc/self/cgroup":                        file("0::/user.slice\n"),
			"proc/self/mountinfo":                     file(v2mount),
			"sys/fs/cgroup/user.slice/memory.max":     file("max\n"),
			"sys/fs/cgroup/user.slice/memory.current": file("100\n"),
		}, 32000000 * 1024, 0, "/proc/meminfo"},
		{"v2 limit on a parent is the tighter", fstest.MapFS{
			"proc/meminfo":                                  file(meminfo),
			"proc/self/cgroup":                              file("0::/kubepods/pod1/c1\n"),
			"proc/self/mountinfo":                           file(v2mount),
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max":     file("max\n"),
			"sys/fs/cgroup/kubepods/pod1/c1/memory.current": file("1073741824\n"),
			"sys/fs/cgroup/kubepods/pod1/memory.max":        file("4294967296\n"),
			"sys/fs/cgroup/kubepods/pod1/memory.current":    file("1073741824\n"),
			"sys/fs/cgroup/kubepods/memory.max":             file("17179869184\n"),
			"sys/fs/cgroup/kubepods/memory.current":         file("1073741824\n"),
		}, 3 * gib, 2, "/sys/fs/cgroup/kubepods/pod1"},
		{"v1 limit", fstest.MapFS{
			"proc/meminfo":        file(meminfo),
			"proc/self/cgroup":    file("9:memory:/docker/abc\n8:cpu,cpuacct:/docker/abc\n0::/\n"),
			"proc/self/mountinfo": file(v1mount),
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": file("2147483648\n"),
			"sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": file("1610612736\n"),
			"sys/fs/cgroup/memory/docker/abc/memory.stat":           file("cache 5\ntotal_inactive_file 536870912\n"),
		}, gib, 1, "cgroup v1"},
		{"v1 unlimited (the kernel's largest page-aligned value)", fstest.MapFS{
			"proc/meminfo":        file(meminfo),
			"proc/self/cgroup":    file("4:memory:/x\n"),
			"proc/self/mountinfo": file(v1mount),
			"sys/fs/cgroup/memory/x/memory.limit_in_bytes": file("9223372036854771712\n"),
			"sys/fs/cgroup/memory/x/memory.usage_in_bytes": file("100\n"),
		}, 32000000 * 1024, 0, "/proc/meminfo"},
		{"v1 path of the host, not mounted here: the mount point's own limit", fstest.MapFS{
			"proc/meminfo":        file(meminfo),
			"proc/self/cgroup":    file("4:memory:/process_api/123\n"),
			"proc/self/mountinfo": file(v1mount),
			"sys/fs/cgroup/memory/memory.limit_in_bytes": file("1073741824\n"),
			"sys/fs/cgroup/memory/memory.usage_in_bytes": file("0\n"),
		}, gib, 1, "cgroup v1"},
		{"usage above the limit leaves nothing", fstest.MapFS{
			"proc/self/cgroup":             file("0::/\n"),
			"proc/self/mountinfo":          file(v2mount),
			"sys/fs/cgroup/memory.max":     file("1000\n"),
			"sys/fs/cgroup/memory.current": file("5000\n"),
		}, 0, 2, "cgroup v2"},
		{"garbage", fstest.MapFS{
			"proc/meminfo":        file("MemAvailable: lots kB\n"),
			"proc/self/cgroup":    file("::::\n0::relative\n"),
			"proc/self/mountinfo": file("- - -\n1 2 3\n"),
		}, 0, 0, "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := Read(tt.fs)
			got, ok := info.Available()
			if got != tt.want || info.CgroupVersion != tt.version {
				t.Errorf("available %d (ok %v), cgroup v%d; want %d, v%d (%+v)", got, ok, info.CgroupVersion, tt.want, tt.version, info)
			}
			if !strings.Contains(info.Source(), tt.sourceHas) {
				t.Errorf("source %q, want it to name %q", info.Source(), tt.sourceHas)
			}
		})
	}
}

// TestSystem reads this machine: whatever its cgroup setup, what is available is known, no more
// than the host's MemAvailable, and a limit found is one the files really hold.
func TestSystem(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skip("no /proc here")
	}
	info := System()
	avail, ok := info.Available()
	if !ok || !info.HostKnown || avail == 0 || avail > info.HostAvailable {
		t.Fatalf("System() = %+v, available %d %v", info, avail, ok)
	}
	if info.Limited() {
		if info.CgroupLimit == 0 || info.CgroupDir == "" {
			t.Errorf("a limit without its figures: %+v", info)
		}
		name := "memory.max"
		if info.CgroupVersion == 1 {
			name = "memory.limit_in_bytes"
		}
		if _, err := os.Stat(info.CgroupDir + "/" + name); err != nil {
			t.Errorf("the limit's file is not there: %v", err)
		}
	}
	t.Logf("%+v; source %s", info, info.Source())
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("0::/\n"), []byte("30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"), []byte("123\n"))
	f.Add([]byte("4:memory:/a/b\n"), []byte("35 31 0:32 /a /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"), []byte("max"))
	f.Fuzz(func(t *testing.T, cg, mi, lim []byte) {
		fsys := fstest.MapFS{
			"proc/self/cgroup":                           &fstest.MapFile{Data: cg},
			"proc/self/mountinfo":                        &fstest.MapFile{Data: mi},
			"sys/fs/cgroup/memory.max":                   &fstest.MapFile{Data: lim},
			"sys/fs/cgroup/memory/memory.limit_in_bytes": &fstest.MapFile{Data: lim},
			"proc/meminfo":                               &fstest.MapFile{Data: lim},
		}
		info := Read(fsys)
		if a, ok := info.Available(); ok && info.Limited() && a > info.CgroupLimit {
			t.Errorf("available %d above the limit %d", a, info.CgroupLimit)
		}
	})
}

func TestParseMemAvailable(t *testing.T) {
	v, ok := parseMeminfo([]byte("MemTotal:       131072000 kB\nMemFree:  1 kB\nMemAvailable:   65536000 kB\n"))
	if !ok || v != 65536000*1024 {
		t.Fatalf("got %d, %v", v, ok)
	}
	if _, ok := parseMeminfo([]byte("MemTotal: 5 kB\n")); ok {
		t.Fatal("found MemAvailable where there is none")
	}
	if v, ok := MemAvailable(); !ok || v == 0 {
		t.Fatalf("MemAvailable() = %d, %v on a Linux machine", v, ok)
	}
}
