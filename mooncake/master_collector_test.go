package mooncake_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvctl/kvctl/mooncake"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

func parseProm(t *testing.T, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, text)
	}
	return fams
}

// TestMasterCollectorMatchesRender checks that the collector exports exactly the families,
// types, help texts, labels and values the master-compatible renderer prints.
func TestMasterCollectorMatchesRender(t *testing.T) {
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "seg-a", Capacity: 8 << 20}}
	p, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	for i := range 5 {
		k := fmt.Sprintf("key-%d", i)
		if c := p.BatchPut(ctx, []string{k}, [][]byte{bytes.Repeat([]byte{byte(i)}, 1000*(i+1))}, pool.ReplicateConfig{}); c[0] != pool.OK {
			t.Fatalf("put %s: %v", k, c[0])
		}
	}
	p.BatchGet(ctx, []string{"key-1", "missing"}, [][]byte{make([]byte, 4096), make([]byte, 16)})

	snap, err := p.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := mooncake.RenderMasterMetrics(snap)
	if err != nil {
		t.Fatal(err)
	}
	want := parseProm(t, rendered)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(mooncake.NewMasterCollector(p))
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range got {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	have := parseProm(t, buf.Bytes())
	// The admin endpoint's /metrics is the collector's output, not a second printer.
	if !bytes.Equal(rendered, buf.Bytes()) {
		t.Errorf("RenderMasterMetrics prints\n%s\nthe collector exports\n%s", rendered, buf.Bytes())
	}
	if len(have) != len(want) {
		t.Errorf("collector exports %d families, the renderer prints %d", len(have), len(want))
	}
	for name, w := range want {
		h := have[name]
		if h == nil {
			t.Errorf("collector lacks %s", name)
			continue
		}
		if h.GetType() != w.GetType() || h.GetHelp() != w.GetHelp() {
			t.Errorf("%s: type/help %v %q, want %v %q", name, h.GetType(), h.GetHelp(), w.GetType(), w.GetHelp())
		}
		if hs, ws := sampleText(h), sampleText(w); hs != ws {
			t.Errorf("%s: samples\n%s\nwant\n%s", name, hs, ws)
		}
	}
	if v := have["master_key_count"].GetMetric()[0].GetGauge().GetValue(); v != 5 {
		t.Errorf("master_key_count = %v, want 5", v)
	}
}

func sampleText(f *dto.MetricFamily) string {
	var b strings.Builder
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			fmt.Fprintf(&b, "%s=%s ", l.GetName(), l.GetValue())
		}
		switch {
		case m.Gauge != nil:
			fmt.Fprintf(&b, "%v\n", m.GetGauge().GetValue())
		case m.Counter != nil:
			fmt.Fprintf(&b, "%v\n", m.GetCounter().GetValue())
		case m.Untyped != nil:
			fmt.Fprintf(&b, "%v\n", m.GetUntyped().GetValue())
		case m.Histogram != nil:
			h := m.GetHistogram()
			fmt.Fprintf(&b, "count=%d sum=%v", h.GetSampleCount(), h.GetSampleSum())
			for _, bk := range h.GetBucket() {
				fmt.Fprintf(&b, " %v:%d", bk.GetUpperBound(), bk.GetCumulativeCount())
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// TestMasterCollectorPoolError checks that a pool that cannot answer fails the scrape with its
// error rather than exporting stale or zero figures.
func TestMasterCollectorPoolError(t *testing.T) {
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "seg-a", Capacity: 1 << 20}}
	p, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(mooncake.NewMasterCollector(p))
	if _, err := reg.Gather(); err == nil {
		t.Error("gathering from a closed pool returned no error")
	}
}
