package cluster_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvctl/kvctl/mooncake/mooncaketest"
)

var update = flag.Bool("update", false, "rewrite testdata/metrics-cluster.txt")

// scrape reads a host's /metrics as Prometheus text.
func scrape(t *testing.T, h *host) map[string]*dto.MetricFamily {
	t.Helper()
	code, body, err := get(h.admin + "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("%s /metrics: %d %v", h.name, code, err)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s /metrics: %v", h.name, err)
	}
	return fams
}

// TestClusterMetricsDashboardsAndAlerts scrapes both hosts of a real two-host run and evaluates
// the shipped dashboard and alert queries on what they export, with promtool: each host's
// kvctl_pool_* gauges are its own segment (summed over hosts they count the cluster once), the
// cluster's totals come once per master, and the pool-full alert's expression yields one series
// for the cluster, not one per host. The families a cluster host exports are the contract in
// testdata/metrics-cluster.txt, which deploy/ checks its queries against.
func TestClusterMetricsDashboardsAndAlerts(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed: .ci/run installs the Debian package prometheus")
		}
		t.Skip("promtool is not installed (apt-get install prometheus, as .ci/run does)")
	}
	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
	reqs, _ := traceRequests(t, 20)
	a := startServe(t, m, "A")
	a.waitReady(t)
	b := startServe(t, m, "B")
	b.waitReady(t)
	runEngine(t, simConfig(a, "cold"), reqs, 4)
	runEngine(t, simConfig(b, "warm"), renamed(reqs, "warm"), 4)
	st := b.stats(t).Backend

	var series []string
	names := map[string]string{}
	for _, h := range []*host{a, b} {
		for name, f := range scrape(t, h) {
			if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") || f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY {
				continue
			}
			var labels []string
			for _, mt := range f.GetMetric() {
				ls := []string{fmt.Sprintf("instance=%q", h.name), `job="kvctl"`}
				for _, l := range mt.GetLabel() {
					ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
					labels = append(labels, l.GetName())
				}
				v := mt.GetGauge().GetValue() + mt.GetCounter().GetValue() + mt.GetUntyped().GetValue()
				series = append(series, fmt.Sprintf("      - series: '%s{%s}'\n        values: '%s+0x20'", name, strings.Join(ls, ", "), strconv.FormatFloat(v, 'g', -1, 64)))
			}
			sort.Strings(labels)
			line := name + " " + strings.ToLower(f.GetType().String())
			if u := uniq(labels); len(u) > 0 {
				line += " " + strings.Join(u, ",")
			}
			names[name] = line
		}
	}
	checkContract(t, names)

	// The dashboard's pool occupancy stat, over every instance.
	occupancy := dashboardExpr(t, "Pool occupancy")
	occupancy = strings.ReplaceAll(occupancy, `$instance`, ".*")
	alert := alertExpr(t, "KvctlPoolNearlyFull")
	alertShape := strings.ReplaceAll(alert, "> 0.95", ">= 0")
	clusterOcc := float64(st.ClusterUsedBytes) / float64(st.ClusterCapacityBytes)
	test := fmt.Sprintf(`rule_files: []
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
%s
    promql_expr_test:
      - expr: sum(kvctl_pool_capacity_bytes)
        eval_time: 5m
        exp_samples:
          - value: %d
      - expr: %q
        eval_time: 5m
        exp_samples:
          - value: %s
      - expr: count(max by (master) (kvctl_cluster_capacity_bytes))
        eval_time: 5m
        exp_samples:
          - value: 1
      - expr: %q
        eval_time: 5m
        exp_samples:
          - labels: '{master=%q}'
            value: %s
`, strings.Join(series, "\n"), st.ClusterCapacityBytes, occupancy, strconv.FormatFloat(clusterOcc, 'g', -1, 64),
		alertShape, m.RPCAddr, strconv.FormatFloat(clusterOcc, 'g', -1, 64))
	dir := t.TempDir()
	file := filepath.Join(dir, "cluster.test.yaml")
	if err := os.WriteFile(file, []byte(test), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "test", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules on the two hosts' metrics: %v\n%s", err, out)
	}
	if st.ClusterCapacityBytes != 2*64<<20 || st.ClusterUsedBytes == 0 {
		t.Fatalf("cluster %d of %d bytes used", st.ClusterUsedBytes, st.ClusterCapacityBytes)
	}
}

func uniq(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func checkContract(t *testing.T, names map[string]string) {
	t.Helper()
	var lines []string
	for _, l := range names {
		lines = append(lines, l)
	}
	sort.Strings(lines)
	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join("testdata", "metrics-cluster.txt")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if string(want) != got {
		t.Errorf("a cluster host's metric families differ from %s (the names are a contract):\n%s", path, got)
	}
}

func dashboardExpr(t *testing.T, title string) string {
	t.Helper()
	data, err := os.ReadFile("../../deploy/grafana/kvctl-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Panels {
		if p.Title == title && len(p.Targets) == 1 {
			return p.Targets[0].Expr
		}
	}
	t.Fatalf("no single-query panel %q", title)
	return ""
}

func alertExpr(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile("../../deploy/prometheus/kvctl-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The rule's expression is the block after "alert: NAME" and "expr: |" up to "for:".
	s := string(data)
	i := strings.Index(s, "alert: "+name+"\n")
	if i < 0 {
		t.Fatalf("no alert %s", name)
	}
	s = s[i:]
	j, k := strings.Index(s, "expr: |\n"), strings.Index(s, "\n        for:")
	if j < 0 || k < j {
		t.Fatalf("alert %s: no block expression", name)
	}
	return strings.Join(strings.Fields(s[j+len("expr: |\n"):k]), " ")
}
