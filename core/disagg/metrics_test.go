package disagg_test

import (
	"io"
	"net/http"
	"regexp"
	"slices"
	"testing"

	"github.com/kvctl/kvctl/core/disagg"
	"github.com/kvctl/kvctl/core/disagg/disaggtest"
)

// The metric names and labels are a contract with dashboards: pinned here, byte for byte.
func TestMetricNamesArePinned(t *testing.T) {
	want := []string{
		"kvctl_disagg_backends_up",
		"kvctl_disagg_client_disconnects_total",
		"kvctl_disagg_errors_total",
		"kvctl_disagg_first_chunk_failures_total",
		"kvctl_disagg_leg_duration_seconds",
		"kvctl_disagg_legs_in_flight",
		"kvctl_disagg_pool_lookups_total",
		"kvctl_disagg_refused_total",
		"kvctl_disagg_requests_total",
		"kvctl_disagg_responses_total",
		"kvctl_disagg_retries_total",
		"kvctl_disagg_timeouts_total",
	}
	consts := []string{disagg.MetricBackendsUp, disagg.MetricClientDisconnects, disagg.MetricErrors, disagg.MetricFirstChunkFailures,
		disagg.MetricLegSeconds, disagg.MetricLegsInFlight, disagg.MetricPoolLookups, disagg.MetricRefused, disagg.MetricRequests,
		disagg.MetricResponses, disagg.MetricRetries, disagg.MetricTimeouts}
	if !slices.Equal(consts, want) {
		t.Fatalf("metric constants %q, want %q", consts, want)
	}
	s := newSetup(t, 1, 1, "")
	post(t, s.URL+disagg.EndpointCompletions, completion(true, "ok"))
	post(t, s.URL+disagg.EndpointCompletions, completion(true, "fault:"+string(disaggtest.FaultGenCutBeforeFirst)))
	resp, err := http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (kvctl_disagg_\w+) `).FindAllSubmatch(body, -1) {
		got = append(got, string(m[1]))
	}
	slices.Sort(got)
	// Every family with a sample is exported; the rest appear once they count something.
	for _, name := range got {
		if !slices.Contains(want, name) {
			t.Errorf("unpinned metric %s", name)
		}
	}
	for _, series := range []string{
		`kvctl_disagg_requests_total{endpoint="/v1/completions",stream="true"} 2`,
		`kvctl_disagg_responses_total{endpoint="/v1/completions"} 1`,
		`kvctl_disagg_first_chunk_failures_total{endpoint="/v1/completions"} 1`,
		`kvctl_disagg_errors_total{endpoint="/v1/completions",status="502"} 1`,
		`kvctl_disagg_legs_in_flight{role="context",server="` + s.Ctx[0].Addr + `"} 0`,
		`kvctl_disagg_legs_in_flight{role="generation",server="` + s.Gen[0].Addr + `"} 0`,
		`kvctl_disagg_leg_duration_seconds_count{role="generation"} 1`,
		`kvctl_disagg_refused_total{reason="requests"} 0`,
		`kvctl_disagg_refused_total{reason="peer_share"} 0`,
	} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + `$`).Match(body) {
			t.Errorf("missing %s in\n%s", series, body)
		}
	}
}
