package daemon

import (
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/statsapi"
)

// TestStatusPageGPUTime: the status page shows the GPU's own time on checked pages once loads
// have any, with the figures as data attributes, and says nothing of it before (a daemon
// without a GPU never has any).
func TestStatusPageGPUTime(t *testing.T) {
	render := func(loads statsapi.LoadStatsJSON) string {
		var b strings.Builder
		if err := statusTemplate.Execute(&b, statusPage{Stats: statsapi.StatsJSON{Loads: loads}}); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	if page := render(statsapi.LoadStatsJSON{}); strings.Contains(page, `id="gpu-time"`) {
		t.Error("GPU time shown with no GPU-checked loads")
	}
	page := render(statsapi.LoadStatsJSON{GPUCopySeconds: 1.25, GPUCheckSeconds: 0.0625})
	for _, want := range []string{`id="gpu-time"`, `data-copy="1.25"`, `data-check="0.0625"`, "1.250 s copying", "0.062 s checking"} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
}
