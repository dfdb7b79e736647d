package sysmem

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// unlimited is the value at or above which a cgroup v1 limit means no limit (the kernel prints
// the largest page-aligned int64).
const unlimited = 1 << 62

// maxFileBytes bounds what is read from one proc or cgroup file.
const maxFileBytes = 1 << 20

// Info is what Read found.
type Info struct {
	// HostAvailable is MemAvailable of /proc/meminfo; HostKnown is false when it could not
	// be read.
	HostAvailable uint64
	HostKnown     bool
	// CgroupVersion is 1 or 2 when a memory limit was found, else 0.
	CgroupVersion int
	// CgroupDir is the cgroup directory whose limit applies ("" without a limit).
	CgroupDir string
	// CgroupLimit, CgroupUsage and CgroupAvailable describe the limit; all 0 without one.
	CgroupLimit     uint64
	CgroupUsage     uint64
	CgroupAvailable uint64
}

// Limited reports whether a cgroup memory limit applies.
func (i Info) Limited() bool { return i.CgroupVersion != 0 }

// Available returns the memory the process may still take: host available bounded by the
// cgroup's available memory. ok is false when neither is known.
func (i Info) Available() (uint64, bool) {
	switch {
	case i.Limited() && i.HostKnown:
		return min(i.HostAvailable, i.CgroupAvailable), true
	case i.Limited():
		return i.CgroupAvailable, true
	case i.HostKnown:
		return i.HostAvailable, true
	}
	return 0, false
}

// Source says in words where Available comes from, for a log line.
func (i Info) Source() string {
	if i.Limited() && (!i.HostKnown || i.CgroupAvailable < i.HostAvailable) {
		return "cgroup v" + strconv.Itoa(i.CgroupVersion) + " limit of " + i.CgroupDir
	}
	if i.HostKnown {
		return "/proc/meminfo"
	}
	return "unknown"
}

// System reads the running system.
func System() Info { return Read(os.DirFS("/")) }

// Available is System().Available(), in the form of a MemAvailable function.
func Available() (uint64, bool) { return System().Available() }

// MemAvailable returns the host's memory available for new allocations, cgroup limits not
// counted: MemAvailable of /proc/meminfo, or else free pages times the page size. false means
// neither is known. It is the last resort of a caller for which Available knows nothing.
func MemAvailable() (uint64, bool) {
	if b, err := readFile(os.DirFS("/"), "proc/meminfo"); err == nil {
		if v, ok := parseMeminfo(b); ok {
			return v, true
		}
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil && si.Freeram > 0 {
		return si.Freeram * uint64(si.Unit), true
	}
	return 0, false
}

// Read reads fsys, a file system rooted at "/".
func Read(fsys fs.FS) Info {
	var info Info
	if b, err := readFile(fsys, "proc/meminfo"); err == nil {
		info.HostAvailable, info.HostKnown = parseMeminfo(b)
	}
	cg, err := readFile(fsys, "proc/self/cgroup")
	if err != nil {
		return info
	}
	mi, err := readFile(fsys, "proc/self/mountinfo")
	if err != nil {
		return info
	}
	mounts := parseMountinfo(mi)
	for _, l := range parseCgroupFile(cg) {
		var m *mount
		switch {
		case l.v2:
			m = findMount(mounts, func(m mount) bool { return m.fstype == "cgroup2" })
		case l.controllers["memory"]:
			m = findMount(mounts, func(m mount) bool { return m.fstype == "cgroup" && m.options["memory"] })
		}
		if m == nil {
			continue
		}
		if lim, ok := readLimit(fsys, *m, l); ok && (!info.Limited() || lim.avail < info.CgroupAvailable) {
			info.CgroupVersion, info.CgroupDir = lim.version, lim.dir
			info.CgroupLimit, info.CgroupUsage, info.CgroupAvailable = lim.limit, lim.usage, lim.avail
		}
	}
	return info
}

func readFile(fsys fs.FS, name string) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(&limitedReader{f: f, n: maxFileBytes})
	return buf.Bytes(), err
}

type limitedReader struct {
	f fs.File
	n int
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, nil
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.f.Read(p)
	l.n -= n
	return n, err
}

func parseMeminfo(b []byte) (uint64, bool) {
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "MemAvailable:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || kb > 1<<53 {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}

type cgroupLine struct {
	v2          bool
	controllers map[string]bool
	path        string
}

// parseCgroupFile reads /proc/self/cgroup: "hierarchy-ID:controller-list:path" per line, the
// v2 hierarchy being "0::path".
func parseCgroupFile(b []byte) []cgroupLine {
	var out []cgroupLine
	for line := range strings.Lines(string(b)) {
		parts := strings.SplitN(strings.TrimRight(line, "\n"), ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		l := cgroupLine{controllers: map[string]bool{}, path: parts[2]}
		if parts[0] == "0" && parts[1] == "" {
			l.v2 = true
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c != "" {
				l.controllers[c] = true
			}
		}
		out = append(out, l)
	}
	return out
}

type mount struct {
	root, point, fstype string
	options             map[string]bool
}

// parseMountinfo reads /proc/self/mountinfo: "id parent major:minor root mount-point options
// [optional fields] - fstype source super-options".
func parseMountinfo(b []byte) []mount {
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxFileBytes)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := -1
		for i, x := range f {
			if x == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || len(f) < sep+4 {
			continue
		}
		m := mount{root: unescape(f[3]), point: unescape(f[4]), fstype: f[sep+1], options: map[string]bool{}}
		for _, o := range strings.Split(f[sep+3], ",") {
			m.options[o] = true
		}
		out = append(out, m)
	}
	return out
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func findMount(ms []mount, ok func(mount) bool) *mount {
	for i := range ms {
		if ok(ms[i]) {
			return &ms[i]
		}
	}
	return nil
}

type limit struct {
	version             int
	dir                 string
	limit, usage, avail uint64
}

// readLimit finds the tightest limit from the process's cgroup up to the mount's root. A
// cgroup path outside the mount's root (a container with its own cgroup namespace shows "/",
// one without shows the host path) falls back to the mount point itself.
func readLimit(fsys fs.FS, m mount, l cgroupLine) (limit, bool) {
	rel := l.path
	if m.root != "/" {
		r, ok := strings.CutPrefix(l.path, m.root)
		if !ok {
			r = "/"
		}
		rel = r
	}
	top := strings.TrimPrefix(path.Clean(m.point), "/")
	dir := path.Join(top, rel)
	if _, err := fs.Stat(fsys, dir); err != nil {
		dir = top
	}
	version := 1
	if l.v2 {
		version = 2
	}
	var best limit
	found := false
	for d := dir; ; d = path.Dir(d) {
		if lim, ok := readDirLimit(fsys, d, version); ok && (!found || lim.avail < best.avail) {
			best, found = lim, true
		}
		if d == top || d == "." || d == "/" || !strings.HasPrefix(d, top) {
			break
		}
	}
	return best, found
}

func readUint(fsys fs.FS, name string) (uint64, bool, bool) {
	b, err := readFile(fsys, name)
	if err != nil {
		return 0, false, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, true, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, false
	}
	return v, false, true
}

func readDirLimit(fsys fs.FS, dir string, version int) (limit, bool) {
	limFile, useFile, inactive := "memory.max", "memory.current", "inactive_file"
	if version == 1 {
		limFile, useFile, inactive = "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
	}
	lim, isMax, ok := readUint(fsys, path.Join(dir, limFile))
	if !ok || isMax || lim >= unlimited {
		return limit{}, false
	}
	usage, _, _ := readUint(fsys, path.Join(dir, useFile))
	if b, err := readFile(fsys, path.Join(dir, "memory.stat")); err == nil {
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == inactive {
				if v, err := strconv.ParseUint(f[1], 10, 64); err == nil && v <= usage {
					usage -= v
				}
			}
		}
	}
	avail := uint64(0)
	if usage < lim {
		avail = lim - usage
	}
	return limit{version: version, dir: "/" + dir, limit: lim, usage: usage, avail: avail}, true
}
