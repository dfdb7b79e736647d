package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"image/color"
	"image/png"
	"strings"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// twoEqualRuns replays the trace head under two --set values that give the same hit rates (a
// soft pin changes nothing in an unlimited pool), the case where one line used to hide the other.
func twoEqualRuns(t *testing.T) *Report {
	t.Helper()
	tr := readTrace(t, "testdata/conversation_head500.jsonl")
	cfgs, err := Expand(DefaultConfig(), []string{"soft_pin_ttl_ms=0,600000"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Offline(context.Background(), tr, DefaultParams(), cfgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 2 || rep.Runs[0].HitRate != rep.Runs[1].HitRate {
		t.Fatalf("want two runs with equal hit rates, got %+v", rep.Runs)
	}
	return rep
}

// TestPlotProperties pins what the plot must show: a title, axes with units, tick labels, a
// legend entry naming each run's --set combination, and a line style of its own per run.
func TestPlotProperties(t *testing.T) {
	rep := twoEqualRuns(t)
	plots, lines, err := Plots(rep)
	if err != nil {
		t.Fatal(err)
	}
	if len(plots) != 2 {
		t.Fatalf("%d plots, want hit rate and occupancy", len(plots))
	}
	for _, p := range plots {
		if p.Title.Text == "" || !strings.Contains(p.X.Label.Text, "(s)") || !strings.Contains(p.Y.Label.Text, "(%") {
			t.Errorf("plot %q: x %q, y %q: want a title and axes with units", p.Title.Text, p.X.Label.Text, p.Y.Label.Text)
		}
		if ticks := p.X.Tick.Marker.Ticks(p.X.Min, p.X.Max); countLabels(ticks) < 2 {
			t.Errorf("plot %q: x ticks %v", p.Title.Text, ticks)
		}
		if ticks := p.Y.Tick.Marker.Ticks(p.Y.Min, p.Y.Max); countLabels(ticks) < 2 {
			t.Errorf("plot %q: y ticks %v", p.Title.Text, ticks)
		}
		if p.X.Max <= p.X.Min || p.X.Max < rep.Trace.DurationSec*0.5 {
			t.Errorf("plot %q: x from %v to %v for a trace of %v s", p.Title.Text, p.X.Min, p.X.Max, rep.Trace.DurationSec)
		}
	}
	var labels []string
	for _, r := range rep.Runs {
		labels = append(labels, RunLabel(r))
	}
	if strings.Join(labels, "|") != "soft_pin_ttl_ms=0|soft_pin_ttl_ms=600000" {
		t.Errorf("legend labels %v", labels)
	}
	if len(lines) != 2 || len(lines[0]) != 2 || len(lines[1]) != 2 {
		t.Fatalf("lines %v: want two runs in each plot", lines)
	}
	// Both panels share their x range and ticks, so that one time reads at the same place.
	h, o := plots[0].X, plots[1].X
	if h.Min != o.Min || h.Max != o.Max {
		t.Errorf("hit panel x %v..%v, occupancy panel x %v..%v: want the same range", h.Min, h.Max, o.Min, o.Max)
	}
	ht, ot := h.Tick.Marker.Ticks(h.Min, h.Max), o.Tick.Marker.Ticks(o.Min, o.Max)
	if len(ht) != len(ot) {
		t.Errorf("hit panel ticks %v, occupancy ticks %v", ht, ot)
	}
	for i := range min(len(ht), len(ot)) {
		if ht[i] != ot[i] {
			t.Errorf("tick %d: hit %v, occupancy %v", i, ht[i], ot[i])
		}
	}
	// The legend sits inside the axes at the top left.
	for _, p := range plots {
		if !p.Legend.Top || !p.Legend.Left || p.Legend.XOffs <= 0 || p.Legend.YOffs >= 0 {
			t.Errorf("plot %q: legend %+v: want it inside the top left corner", p.Title.Text, p.Legend)
		}
	}
	a, b := lines[0][0].LineStyle, lines[0][1].LineStyle
	if a.Color == b.Color || len(a.Dashes) == len(b.Dashes) {
		t.Errorf("the two runs share a colour or a dash pattern: %+v %+v", a, b)
	}
}

// countLabels counts the ticks that carry a label.
func countLabels(ticks []plot.Tick) int {
	n := 0
	for _, tk := range ticks {
		if tk.Label != "" {
			n++
		}
	}
	return n
}

// TestPlotPNG draws the plot and checks the PNG: its size, and both runs' colours present although
// their figures are equal.
func TestPlotPNG(t *testing.T) {
	rep := twoEqualRuns(t)
	var buf bytes.Buffer
	if err := WritePlot(&buf, rep); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	b := img.Bounds()
	if b.Dx() < 800 || b.Dy() < 600 {
		t.Errorf("plot is %v", b)
	}
	for i := range rep.Runs {
		want := color.RGBAModel.Convert(LineStyle(i).Color).(color.RGBA)
		n := 0
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				if color.RGBAModel.Convert(img.At(x, y)).(color.RGBA) == want {
					n++
				}
			}
		}
		if n < 50 {
			t.Errorf("run %d's colour %v covers %d pixels: its line is not visible", i, want, n)
		}
	}
}

// TestPlotLegendClearsTheLines checks that each panel's legend sits in a band above 100 %, where
// no line can run: a full pool's occupancy and a 100 % hit rate stay below it, with two runs
// and with six.
func TestPlotLegendClearsTheLines(t *testing.T) {
	tr := readTrace(t, "testdata/conversation_head500.jsonl")
	for _, set := range []string{"soft_pin_ttl_ms=0,600000", "soft_pin_ttl_ms=0,1,2,3,4,5"} {
		cfgs, err := Expand(DefaultConfig(), []string{set})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Offline(context.Background(), tr, DefaultParams(), cfgs)
		if err != nil {
			t.Fatal(err)
		}
		img := vgimg.NewWith(vgimg.UseWH(PlotWidth, PlotHeight), vgimg.UseDPI(plotDPI))
		plots, canvases, err := arrange(rep, draw.New(img))
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range plots {
			data := p.DataCanvas(canvases[i])
			_, y := p.Transforms(&data)
			legend := p.Legend.Rectangle(data)
			if legend.Min.Y < y(100) {
				t.Errorf("%s, %q: the legend reaches down to %v, below the 100 %% line at %v", set, p.Title.Text, legend.Min.Y, y(100))
			}
			if legend.Max.Y > data.Max.Y+vg.Millimeter {
				t.Errorf("%s, %q: the legend's top %v is above the data area's %v", set, p.Title.Text, legend.Max.Y, data.Max.Y)
			}
			for _, tk := range p.Y.Tick.Marker.Ticks(p.Y.Min, p.Y.Max) {
				if tk.Label != "" && tk.Value > 100 {
					t.Errorf("%q: a y tick labelled %s above 100 %%", p.Title.Text, tk.Label)
				}
			}
		}
	}
}

// TestTimelineInJSON checks that -o json carries the timeline the plot draws.
func TestTimelineInJSON(t *testing.T) {
	rep := twoEqualRuns(t)
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Runs []struct {
			Timeline []map[string]float64 `json:"timeline"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	tl := back.Runs[0].Timeline
	if len(tl) != len(rep.Runs[0].Timeline) || len(tl) == 0 {
		t.Fatalf("timeline of %d points in JSON, %d in the report", len(tl), len(rep.Runs[0].Timeline))
	}
	for _, k := range []string{"at_seconds", "requests", "local_hit_rate", "pool_hit_rate", "occupancy"} {
		if _, ok := tl[len(tl)-1][k]; !ok {
			t.Errorf("timeline point lacks %s: %v", k, tl[len(tl)-1])
		}
	}
	if tl[len(tl)-1]["at_seconds"] != rep.Runs[0].Timeline[len(tl)-1].AtSec {
		t.Error("timeline point differs from the report's")
	}
}
