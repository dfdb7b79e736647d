package daemon_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/statsapi"
)

// dataValues reads every id="X" ... data-value="V" pair of the status page.
func dataValues(page string) map[string]string {
	re := regexp.MustCompile(`id="([a-z-]+)"[^>]*data-value="([^"]*)"`)
	out := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(page, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// TestStatusPage renders the status page of a daemon that served a replay: plain HTML with no
// script, refreshing itself, sized for a phone, and showing the figures /v1/stats reports.
func TestStatusPage(t *testing.T) {
	r := start(t, 128<<20)
	base := "http://" + r.Info.AdminAddr
	replayColdWarm(t, r)

	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	code, page := getText(t, base+"/")
	if code != 200 {
		t.Fatalf("/: %d", code)
	}
	var st statsapi.StatsJSON
	getJSON(t, base+"/v1/stats", &st)
	for _, want := range []string{`<meta http-equiv="refresh" content="5">`, `name="viewport" content="width=device-width, initial-scale=1"`, `<svg id="occupancy-chart"`, `<polyline points=`} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %s", want)
		}
	}
	if want := fmt.Sprintf(`id="occupancy-bar" style="width: %.1f%%"`, 100*float64(st.Pool.UsedBytes)/float64(st.Pool.CapacityBytes)); !strings.Contains(page, want) {
		t.Errorf("status page lacks %s", want)
	}
	if strings.Contains(strings.ToLower(page), "<script") {
		t.Error("status page has a script")
	}
	v := dataValues(page)
	checks := map[string]string{
		"pool-used": strconv.FormatInt(st.Pool.UsedBytes, 10), "pool-capacity": strconv.FormatInt(st.Pool.CapacityBytes, 10),
		"pool-objects": strconv.FormatInt(st.Pool.Objects, 10), "holes-hit-blocks": strconv.FormatInt(st.PrefixHoles.HitBlocks, 10),
		"holes-lookups": strconv.FormatInt(st.PrefixHoles.Lookups, 10), "load-pages": strconv.FormatInt(st.Loads.Pages, 10),
		"save-pages": strconv.FormatInt(st.Saves.PutPages, 10), "engine-count": strconv.Itoa(len(st.Engines)),
		"hit-pool": strconv.FormatFloat(st.HitRates.Pool, 'g', -1, 64), "ready": "true", "pool-health": "true",
	}
	for id, want := range checks {
		if v[id] != want {
			t.Errorf("status page %s = %q, /v1/stats says %q", id, v[id], want)
		}
	}
	for _, e := range st.Engines {
		row := `data-engine="` + e.Engine + `" data-model="` + e.ModelKey + `" data-rank="` + strconv.Itoa(e.Rank) + `"`
		if !strings.Contains(page, row) {
			t.Errorf("status page lacks engine row %s", row)
		}
	}
	// The Mooncake endpoints under / are unchanged.
	if code, _ := getText(t, base+"/get_all_keys"); code != 200 {
		t.Errorf("/get_all_keys: %d", code)
	}
	if code, _ := getText(t, base+"/no-such-path"); code != 404 {
		t.Errorf("/no-such-path: %d", code)
	}
}
