package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvctl/kvctl/commands/cmdutil/cmdtest"
	"github.com/kvctl/kvctl/commands/root"
)

// tool finds a command the test needs; without it the test skips, except under CI=true, where
// .ci/run installs it.
func tool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not installed: .ci/run installs the Debian package %s", name, pkg)
	}
	t.Skipf("%s is not installed (apt-get install %s, as .ci/run does)", name, pkg)
	return ""
}

// serveFlags parses args (what follows "kvctl serve") with kvctl serve's own flags and returns
// the values of those named.
func serveFlags(t *testing.T, args []string, names ...string) map[string]string {
	t.Helper()
	// The whole tree, so that the global flags (--log-format, --log-level) are there too.
	cmd, _, err := root.NewCmdRoot(cmdtest.Factory()).Find([]string{"serve"})
	if err != nil || cmd.Name() != "serve" {
		t.Fatalf("no serve command: %v", err)
	}
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatalf("kvctl serve refuses %v: %v", args, err)
	}
	if rest := cmd.Flags().Args(); len(rest) > 0 {
		t.Fatalf("kvctl serve takes no arguments, got %v", rest)
	}
	out := map[string]string{}
	for _, n := range names {
		fl := cmd.Flags().Lookup(n)
		if fl == nil {
			t.Fatalf("kvctl serve has no --%s", n)
		}
		out[n] = fl.Value.String()
	}
	return out
}

// TestSystemdUnit checks the unit with systemd-analyze verify and its command line with kvctl
// serve's flags.
func TestSystemdUnit(t *testing.T) {
	analyze := tool(t, "systemd-analyze", "systemd")
	unit, err := os.ReadFile("systemd/kvctl.service")
	if err != nil {
		t.Fatal(err)
	}
	var execStart string
	sc := bufio.NewScanner(bytes.NewReader(unit))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ExecStart="); ok {
			execStart = v
		}
	}
	fields := strings.Fields(execStart)
	if len(fields) < 2 || fields[0] != "/usr/local/bin/kvctl" || fields[1] != "serve" {
		t.Fatalf("ExecStart=%s: want /usr/local/bin/kvctl serve ...", execStart)
	}
	got := serveFlags(t, fields[2:], "metrics-addr", "admin-addr", "socket", "drain-timeout")
	if got["metrics-addr"] != ":9481" || got["admin-addr"] != "127.0.0.1:9480" || got["socket"] != "/run/kvctl/kvctl.sock" || got["drain-timeout"] != "30s" {
		t.Errorf("ExecStart flags read as %v", got)
	}
	// systemd-analyze verify wants the binary to exist: point a copy of the unit at one that does.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kvctl.service")
	if err := os.WriteFile(path, bytes.ReplaceAll(unit, []byte("/usr/local/bin/kvctl"), []byte(self)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("kvctl.service")) {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestKubernetesManifests decodes each document strictly into its Kubernetes API type (an
// unknown or misspelt field fails) and checks that the pieces fit: the Service selects the
// DaemonSet's pods and names their metrics port, the ServiceMonitor selects the Service and
// scrapes /metrics there, the probes use the metrics listener, and the container's arguments
// are valid kvctl serve flags that keep the admin API on loopback.
func TestKubernetesManifests(t *testing.T) {
	ds, svc, sm := manifests(t)
	pod := ds.Spec.Template
	for k, v := range ds.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("the DaemonSet's selector %s=%s does not match its pods", k, v)
		}
	}
	for k, v := range svc.Spec.Selector {
		if pod.Labels[k] != v {
			t.Errorf("the Service's selector %s=%s does not match the DaemonSet's pods", k, v)
		}
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("container args %v: want serve ...", c.Args)
	}
	flags := serveFlags(t, c.Args[1:], "metrics-addr", "admin-addr", "log-format", "pool-size")
	if flags["admin-addr"] != "127.0.0.1:9480" {
		t.Errorf("the admin API must stay on loopback, got --admin-addr %s", flags["admin-addr"])
	}
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
		}
	}
	if want := fmt.Sprintf(":%d", metricsPort); metricsPort == 0 || flags["metrics-addr"] != want {
		t.Errorf("container port metrics %d, --metrics-addr %s", metricsPort, flags["metrics-addr"])
	}
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		want := map[string]string{"readiness": "/readyz", "liveness": "/healthz"}[name]
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v: want GET %s on the metrics port", name, p, want)
		}
	}
	if c.Resources.Limits.Memory().IsZero() {
		t.Error("no memory limit: --pool-size auto sizes the pool from the cgroup limit")
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "metrics" || svc.Spec.Ports[0].Port != metricsPort {
		t.Errorf("Service ports %+v: want metrics -> the container's metrics port", svc.Spec.Ports)
	}
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.Labels[k] != v {
			t.Errorf("the ServiceMonitor's selector %s=%s does not match the Service", k, v)
		}
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v: want port metrics, path /metrics", sm.Spec.Endpoints)
	}
	if ds.Namespace != svc.Namespace || len(sm.Spec.NamespaceSelector.MatchNames) != 1 || sm.Spec.NamespaceSelector.MatchNames[0] != svc.Namespace {
		t.Errorf("namespaces differ: DaemonSet %s, Service %s, ServiceMonitor selects %v", ds.Namespace, svc.Namespace, sm.Spec.NamespaceSelector.MatchNames)
	}
}

// manifests decodes kubernetes/kvctl.yaml strictly into its API types.
func manifests(t *testing.T) (*appsv1.DaemonSet, *corev1.Service, *monitoringv1.ServiceMonitor) {
	t.Helper()
	data, err := os.ReadFile("kubernetes/kvctl.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	var svc *corev1.Service
	var sm *monitoringv1.ServiceMonitor
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var into any
		switch meta.Kind {
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			into = ds
		case "Service":
			svc = &corev1.Service{}
			into = svc
		case "ServiceMonitor":
			sm = &monitoringv1.ServiceMonitor{}
			into = sm
		default:
			t.Fatalf("document %d: unexpected kind %q", i, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
	}
	if ds == nil || svc == nil || sm == nil {
		t.Fatal("want a DaemonSet, a Service and a ServiceMonitor")
	}
	return ds, svc, sm
}

// contract reads the metric families kvctl exports (the committed lists the metric contract
// test checks /metrics against), with the series names each family's samples carry.
func contract(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	// An embedded pool's families, and a Mooncake cluster host's (scraped from a real two-host
	// run by core/cluster's TestClusterMetricsDashboardsAndAlerts).
	for _, f := range []string{"../core/daemon/testdata/metrics-fresh.txt", "../core/daemon/testdata/metrics-after-replay.txt", "../core/cluster/testdata/metrics-cluster.txt"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			fields := strings.Fields(line)
			if len(fields) < 2 {
				continue
			}
			names[fields[0]] = true
			if fields[1] == "histogram" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[fields[0]+s] = true
				}
			}
		}
	}
	return names
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promDuration = regexp.MustCompile(`\b\d+(ms|s|m|h|d|w|y)\b`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promWords    = map[string]bool{
		"sum": true, "rate": true, "irate": true, "increase": true, "histogram_quantile": true, "max": true, "min": true,
		"avg": true, "count": true, "vector": true, "offset": true, "and": true, "or": true, "unless": true, "by": true,
		"without": true, "label_values": true, "instance": true, "le": true, "topk": true, "abs": true, "clamp_min": true,
		"bool": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	}
)

// seriesIn returns the metric names a PromQL expression (or a Grafana label_values query)
// reads: what is left once strings, label matchers, groupings, ranges, numbers, functions
// and keywords are taken out.
func seriesIn(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, "")
	e = promGrouping.ReplaceAllString(e, "")
	e = promRanges.ReplaceAllString(e, "")
	e = promDuration.ReplaceAllString(e, "")
	e = strings.ReplaceAll(e, "$__rate_interval", "")
	var out []string
	for _, id := range promIdent.FindAllString(e, -1) {
		if !promWords[id] && !strings.HasPrefix(id, "$") {
			out = append(out, id)
		}
	}
	return out
}

// TestDashboardQueries checks that every query of the Grafana dashboard reads only series kvctl
// exports.
func TestDashboardQueries(t *testing.T) {
	data, err := os.ReadFile("grafana/kvctl-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&dash); err != nil {
		t.Fatal(err)
	}
	known := contract(t)
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok && strings.Contains(q, "(") {
			exprs = append(exprs, q)
		}
	}
	if dash.UID == "" || len(exprs) < 10 {
		t.Fatalf("dashboard uid %q, %d queries", dash.UID, len(exprs))
	}
	checkSeries(t, "dashboard", exprs, known, nil)
}

func checkSeries(t *testing.T, what string, exprs []string, known, extra map[string]bool) {
	t.Helper()
	for _, e := range exprs {
		names := seriesIn(e)
		if len(names) == 0 {
			t.Errorf("%s query %q names no series", what, e)
		}
		for _, n := range names {
			if !known[n] && !extra[n] {
				t.Errorf("%s query %q names %s, which kvctl does not export", what, e, n)
			}
		}
	}
}

// TestAlertRules runs promtool's checks and the rules' unit tests, and checks that every rule
// reads only series kvctl exports (and Prometheus's own up).
func TestAlertRules(t *testing.T) {
	data, err := os.ReadFile("prometheus/kvctl-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	// promtool checks the schema; this reads the expressions.
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			alerts[r.Alert] = true
		}
	}
	for _, a := range []string{"KvctlPoolNearlyFull", "KvctlHitRateCollapse", "KvctlLoadsFailing", "KvctlEngineRPCErrors", "KvctlNotReady"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
	checkSeries(t, "alert", exprs, contract(t), map[string]bool{"up": true})

	// The job label the shipped ServiceMonitor gives the scrape is the one the alerts (and
	// their unit tests' input series) select: the Prometheus Operator sets job to the value of
	// the Service's label named by jobLabel, else to the Service's name.
	_, svc, sm := manifests(t)
	job := svc.Name
	if v, ok := svc.Labels[sm.Spec.JobLabel]; sm.Spec.JobLabel != "" && ok {
		job = v
	}
	tests, err := os.ReadFile("prometheus/kvctl-alerts.test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	jobRe := regexp.MustCompile(`job\s*=~?\s*"([^"]*)"`)
	found := 0
	for what, text := range map[string]string{"kvctl-alerts.yaml": string(data), "kvctl-alerts.test.yaml": string(tests)} {
		for _, m := range jobRe.FindAllStringSubmatch(text, -1) {
			found++
			if m[1] != job {
				t.Errorf("%s selects job=%q, but the shipped ServiceMonitor scrapes kvctl as job=%q", what, m[1], job)
			}
		}
	}
	if found == 0 {
		t.Error("no rule selects the scrape job: a kvctl that does not answer scrapes would never alert")
	}

	promtool := tool(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "rules", "kvctl-alerts.yaml"}, {"test", "rules", "kvctl-alerts.test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestSeriesIn pins the query reader the checks above rely on.
func TestSeriesIn(t *testing.T) {
	got := seriesIn(`histogram_quantile(0.99, sum by (le) (rate(kvctl_load_duration_seconds_bucket{instance=~"$instance"}[$__rate_interval]))) / on(instance) kvctl_pool_used_bytes offset 5m or vector(0)`)
	if strings.Join(got, ",") != "kvctl_load_duration_seconds_bucket,kvctl_pool_used_bytes" {
		t.Errorf("seriesIn = %v", got)
	}
}
