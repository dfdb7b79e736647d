package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// These tests start kvctl serve exactly as each artefact ships it: the same user and group,
// the socket directory with the owner and mode the artefact gives it, the same flags and
// environment. Only what cannot be shared on a test host changes: /run becomes a temporary
// directory and the two ports free ones. They need root (to create the users and to drop to
// them with setpriv) and skip without it.

// needRoot skips a test that must create users and change to them.
func needRoot(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the deploy start tests run as root in CI (they create users and drop to them)")
		}
		t.Skip("needs root: creates users and runs kvctl serve as them with setpriv")
	}
	return tool(t, "setpriv", "util-linux")
}

var (
	imageBinOnce sync.Once
	imageBin     string
	imageBinErr  error
)

// dockerfileBuild returns the builder's go build command from the Dockerfile.
func dockerfileBuild(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if cmd, ok := strings.CutPrefix(l, "RUN "); ok && strings.Contains(cmd, "go build") {
			return cmd
		}
	}
	t.Fatal("the Dockerfile has no RUN ... go build line")
	return ""
}

// kvctlAsImageBuilds builds kvctl with the Dockerfile's own build command (its -o pointed at a
// temporary directory readable by every user), once per test binary.
func kvctlAsImageBuilds(t *testing.T) string {
	t.Helper()
	imageBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvctl-image-")
		if err != nil {
			imageBinErr = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			imageBinErr = err
			return
		}
		imageBin = filepath.Join(dir, "kvctl")
		build := strings.ReplaceAll(dockerfileBuild(t), "/out/kvctl", imageBin)
		build = strings.NewReplacer("${VERSION}", "v0.0.0-deploytest", "${COMMIT}", "0123456789abcdef").Replace(build)
		cmd := exec.Command("sh", "-c", build)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			imageBinErr = fmt.Errorf("%s: %w\n%s", build, err, out)
		}
	})
	if imageBinErr != nil {
		t.Fatal(imageBinErr)
	}
	return imageBin
}

// publicTempDir is a temporary directory every user can enter, as /run is.
func publicTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/" && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// ensureUser creates a system user and its group when the host lacks them, as the artefact's
// install notes say, and removes them after the test.
func ensureUser(t *testing.T, name string) (uid, gid int) {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		out, err := exec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
		if err != nil {
			t.Fatalf("useradd %s: %v\n%s", name, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
		if u, err = user.Lookup(name); err != nil {
			t.Fatal(err)
		}
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// started is a kvctl serve process started as an artefact starts it.
type started struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan error
}

// startAs runs bin with args as uid:gid with exactly the supplementary groups given (setpriv)
// and the environment env, and waits for GET readyURL to answer 200.
func startAs(t *testing.T, setpriv, bin string, uid, gid int, groups []int, env, args []string, readyURL string) *started {
	t.Helper()
	priv := []string{"--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid)}
	if len(groups) == 0 {
		priv = append(priv, "--clear-groups")
	} else {
		g := make([]string, len(groups))
		for i, x := range groups {
			g[i] = strconv.Itoa(x)
		}
		priv = append(priv, "--groups="+strings.Join(g, ","))
	}
	cmd := exec.Command(setpriv, append(append(priv, "--", bin), args...)...)
	cmd.Env = env
	cmd.Dir = "/"
	p := &started{cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	cmd.Stderr = &lockedBuffer{b: p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	for i := 0; i < 600; i++ {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("kvctl %s exited before it was ready (%v):\n%s", strings.Join(args, " "), err, p.stderr)
		default:
		}
		if resp, err := http.Get(readyURL); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("kvctl %s never answered %s:\n%s", strings.Join(args, " "), readyURL, p.stderr)
	return nil
}

// stop sends SIGTERM, as systemd and kubelet do, and wants exit 0.
func (p *started) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Errorf("kvctl serve on SIGTERM: %v\n%s", err, p.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Errorf("kvctl serve did not stop within 60 s of SIGTERM")
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// connectAs connects to the unix socket path as uid:gid with groups, through python3 (a process
// of that user, as an engine is), and returns its error output ("" when it connected).
func connectAs(t *testing.T, setpriv string, uid, gid int, groups []int, path string) string {
	t.Helper()
	// The system's python3: one under root's home (pyenv) is not reachable by other users.
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("/usr/bin/python3 is needed to connect as another user")
	}
	priv := []string{"--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid)}
	if len(groups) == 0 {
		priv = append(priv, "--clear-groups")
	} else {
		g := make([]string, len(groups))
		for i, x := range groups {
			g[i] = strconv.Itoa(x)
		}
		priv = append(priv, "--groups="+strings.Join(g, ","))
	}
	script := "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect(sys.argv[1])\nexcept OSError as e:\n print(e); sys.exit(1)\n"
	out, err := exec.Command(setpriv, append(priv, "--", py, "-c", script, path)...).CombinedOutput()
	if err != nil {
		return strings.TrimSpace(string(out)) + " " + err.Error()
	}
	return ""
}

// systemdUnit is what TestSystemdUnitStarts reads from kvctl.service.
type systemdUnit struct {
	User, Group, RuntimeDirectory string
	RuntimeDirectoryMode          os.FileMode
	Env                           []string
	ExecStart                     []string
}

func readUnit(t *testing.T) systemdUnit {
	t.Helper()
	data, err := os.ReadFile("systemd/kvctl.service")
	if err != nil {
		t.Fatal(err)
	}
	u := systemdUnit{RuntimeDirectoryMode: 0o755} // systemd's default
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		switch k {
		case "User":
			u.User = v
		case "Group":
			u.Group = v
		case "RuntimeDirectory":
			u.RuntimeDirectory = v
		case "RuntimeDirectoryMode":
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil {
				t.Fatalf("RuntimeDirectoryMode=%s: %v", v, err)
			}
			u.RuntimeDirectoryMode = os.FileMode(m)
		case "Environment":
			u.Env = append(u.Env, v)
		case "ExecStart":
			u.ExecStart = strings.Fields(v)
		}
	}
	if u.User == "" || u.RuntimeDirectory == "" || len(u.ExecStart) < 2 {
		t.Fatalf("unit %+v: want User=, RuntimeDirectory= and ExecStart=", u)
	}
	if u.Group == "" {
		u.Group = u.User
	}
	return u
}

// rewrite points the artefact's /run paths at root and its admin and metrics ports at free ones.
func rewrite(args []string, runFrom, runTo string, ports map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		a = strings.ReplaceAll(a, runFrom, runTo)
		for from, to := range ports {
			a = regexp.MustCompile(`:`+from+`\b`).ReplaceAllString(a, ":"+to)
		}
		out[i] = a
	}
	return out
}

// TestSystemdUnitStarts starts kvctl serve as kvctl.service does: as User/Group (with the
// user's groups, as systemd's initgroups gives them), in a RuntimeDirectory systemd creates
// owned by that user with RuntimeDirectoryMode, with the unit's Environment and ExecStart. A
// unit serve refuses (a 0750 directory without --engine-group) fails here. It then checks what
// the unit's comment promises: a member of the group reaches the engine socket, anyone else
// does not.
func TestSystemdUnitStarts(t *testing.T) {
	setpriv := needRoot(t)
	bin := kvctlAsImageBuilds(t)
	u := readUnit(t)
	uid, _ := ensureUser(t, u.User)
	g, err := user.LookupGroup(u.Group)
	if err != nil {
		t.Fatal(err)
	}
	gid, _ := strconv.Atoi(g.Gid)

	root := publicTempDir(t)
	runDir := filepath.Join(root, "run", u.RuntimeDirectory)
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(runDir, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(runDir, u.RuntimeDirectoryMode); err != nil {
		t.Fatal(err)
	}
	admin, metrics := freePort(t), freePort(t)
	args := rewrite(u.ExecStart[1:], "/run/", root+"/run/", map[string]string{"9480": admin, "9481": metrics})
	env := append([]string{"PATH=/usr/bin:/bin", "LANG=C"}, u.Env...)
	groups := []int{gid}
	p := startAs(t, setpriv, bin, uid, gid, groups, env, args, "http://127.0.0.1:"+metrics+"/readyz")

	sock := filepath.Join(runDir, "kvctl.sock")
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatalf("no engine socket at %s: %v\n%s", sock, err, p.stderr)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || int(st.Gid) != gid {
		t.Errorf("engine socket mode %04o group %d, want 0660 group %d", fi.Mode().Perm(), st.Gid, gid)
	}
	const engineUID = 64991
	if msg := connectAs(t, setpriv, engineUID, engineUID, []int{gid}, sock); msg != "" {
		t.Errorf("an engine in group %s cannot reach the socket: %s", u.Group, msg)
	}
	if msg := connectAs(t, setpriv, engineUID, engineUID, nil, sock); msg == "" {
		t.Errorf("a user outside group %s reached the engine socket", u.Group)
	}
	p.stop(t)
}

// TestDaemonSetStarts starts kvctl serve as the DaemonSet's pod does: the hostPath created as
// kubelet's DirectoryOrCreate creates it (root, 0755), then the init containers' commands as
// their user, then the container's args as its runAsUser/runAsGroup with no supplementary
// groups, the image's binary (built with the Dockerfile's command), and the readiness probe's
// path on the metrics port. An engine pod with supplementalGroups [runAsGroup] reaches the
// socket.
func TestDaemonSetStarts(t *testing.T) {
	setpriv := needRoot(t)
	bin := kvctlAsImageBuilds(t)
	ds, _, _ := manifests(t)
	pod := ds.Spec.Template.Spec

	root := publicTempDir(t)
	hostPaths := map[string]string{} // mount path in the pod -> directory on this host
	volumes := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			volumes[v.Name] = filepath.Join(root, v.HostPath.Path)
			// kubelet's DirectoryOrCreate: root-owned, 0755.
			if err := os.MkdirAll(volumes[v.Name], 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := pod.Containers[0]
	for _, m := range c.VolumeMounts {
		if d, ok := volumes[m.Name]; ok {
			hostPaths[m.MountPath] = d
		}
	}
	if len(hostPaths) == 0 {
		t.Fatal("the container mounts no hostPath: engines on the node could not reach its socket")
	}
	mapPaths := func(s string) string {
		for from, to := range hostPaths {
			s = strings.ReplaceAll(s, from, to)
		}
		return s
	}
	for _, ic := range pod.InitContainers {
		runAs := int64(0)
		if ic.SecurityContext != nil && ic.SecurityContext.RunAsUser != nil {
			runAs = *ic.SecurityContext.RunAsUser
		}
		cmdline := make([]string, 0, len(ic.Command)+len(ic.Args))
		for _, a := range append(append([]string{}, ic.Command...), ic.Args...) {
			cmdline = append(cmdline, mapPaths(a))
		}
		cmd := exec.Command(setpriv, append([]string{"--reuid=" + strconv.FormatInt(runAs, 10), "--regid=" + strconv.FormatInt(runAs, 10), "--clear-groups", "--"}, cmdline...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("init container %s: %v\n%s", ic.Name, err, out)
		}
	}

	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || sc.RunAsGroup == nil {
		t.Fatal("the container names no runAsUser and runAsGroup")
	}
	uid, gid := int(*sc.RunAsUser), int(*sc.RunAsGroup)
	var metricsPort string
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = strconv.Itoa(int(p.ContainerPort))
		}
	}
	admin, metrics := freePort(t), freePort(t)
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		args[i] = mapPaths(a)
	}
	args = rewrite(args, "\x00", "\x00", map[string]string{"9480": admin, metricsPort: metrics})
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/"}
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	probe := c.ReadinessProbe.HTTPGet.Path
	p := startAs(t, setpriv, bin, uid, gid, nil, env, args, "http://127.0.0.1:"+metrics+probe)

	sockDir := hostPaths["/run/kvctl"]
	sock := filepath.Join(sockDir, "kvctl.sock")
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("no engine socket at %s: %v\n%s", sock, err, p.stderr)
	}
	const engineUID = 64992
	if msg := connectAs(t, setpriv, engineUID, engineUID, []int{gid}, sock); msg != "" {
		t.Errorf("an engine pod with supplementalGroups [%d] cannot reach the socket: %s", gid, msg)
	}
	if msg := connectAs(t, setpriv, engineUID, engineUID, nil, sock); msg == "" {
		t.Errorf("a pod outside group %d reached the engine socket", gid)
	}
	p.stop(t)
}

// TestImage checks what can be checked of the image without a container runtime: the
// Dockerfile's final stage runs as the DaemonSet's runAsUser:runAsGroup with kvctl as its
// entrypoint, the DaemonSet names the image `make image` tags, and the binary built with the
// Dockerfile's command runs as that user and reports the version and commit it was built with.
func TestImage(t *testing.T) {
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var userLine, entrypoint string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "FROM ") {
			userLine, entrypoint = "", "" // only the final stage counts
		}
		if v, ok := strings.CutPrefix(l, "USER "); ok {
			userLine = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(l, "ENTRYPOINT "); ok {
			entrypoint = strings.TrimSpace(v)
		}
	}
	ds, _, _ := manifests(t)
	c := ds.Spec.Template.Spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || sc.RunAsGroup == nil {
		t.Fatal("the DaemonSet's container names no runAsUser and runAsGroup")
	}
	if want := fmt.Sprintf("%d:%d", *sc.RunAsUser, *sc.RunAsGroup); userLine != want || *sc.RunAsUser == 0 {
		t.Errorf("the image's USER is %q, the DaemonSet runs as %s (and not as root)", userLine, want)
	}
	if entrypoint != `["/usr/local/bin/kvctl"]` {
		t.Errorf("ENTRYPOINT %s: want [\"/usr/local/bin/kvctl\"], so the DaemonSet's args start with the command", entrypoint)
	}
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^IMAGE\s*\?=\s*(\S+)`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile has no IMAGE ?= for `make image`")
	}
	if repo, _, _ := strings.Cut(c.Image, ":"); repo != string(m[1]) {
		t.Errorf("the DaemonSet runs %s, but make image builds %s", c.Image, m[1])
	}

	setpriv := needRoot(t)
	bin := kvctlAsImageBuilds(t)
	uid := strconv.FormatInt(*sc.RunAsUser, 10)
	gid := strconv.FormatInt(*sc.RunAsGroup, 10)
	cmd := exec.Command(setpriv, "--reuid="+uid, "--regid="+gid, "--clear-groups", "--", bin, "version", "-o", "json")
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/"} // a container's, not the test's
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the image's kvctl as %s:%s: %v\n%s", uid, gid, err, out)
	}
	for _, w := range []string{`"v0.0.0-deploytest"`, `"0123456789abcdef"`} {
		if !bytes.Contains(out, []byte(w)) {
			t.Errorf("kvctl version says %s, want %s", out, w)
		}
	}
}
