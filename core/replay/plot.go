package replay

import (
	"fmt"
	"image/color"
	"io"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot size and look.
const (
	PlotWidth  = 24 * vg.Centimeter
	PlotHeight = 18 * vg.Centimeter
	plotDPI    = 96
)

// plotColors are told apart by people with the common colour-vision deficiencies (Okabe-Ito).
var plotColors = []color.RGBA{
	{0x00, 0x72, 0xb2, 0xff}, {0xd5, 0x5e, 0x00, 0xff}, {0x00, 0x9e, 0x73, 0xff}, {0xcc, 0x79, 0xa7, 0xff},
	{0xe6, 0x9f, 0x00, 0xff}, {0x56, 0xb4, 0xe9, 0xff}, {0x00, 0x00, 0x00, 0xff}, {0xf0, 0xe4, 0x42, 0xff},
}

// plotDashes give each run a line style of its own as well, so that two runs with the same
// figures stay visible and the plot reads in grey.
var plotDashes = [][]vg.Length{
	nil, {vg.Points(6), vg.Points(3)}, {vg.Points(2), vg.Points(2)}, {vg.Points(8), vg.Points(3), vg.Points(2), vg.Points(3)},
	{vg.Points(12), vg.Points(4)}, {vg.Points(1), vg.Points(3)},
}

// LineStyle is the style of run i's lines.
func LineStyle(i int) draw.LineStyle {
	return draw.LineStyle{Color: plotColors[i%len(plotColors)], Width: vg.Points(1.6), Dashes: plotDashes[i%len(plotDashes)]}
}

// RunLabel names a run in the legend: its --set combination, or "baseline" without one.
func RunLabel(r RunReport) string {
	if len(r.Settings) == 0 {
		if r.Name != "" {
			return r.Name
		}
		return "baseline"
	}
	parts := make([]string, len(r.Settings))
	for i, s := range r.Settings {
		parts[i] = s.Key + "=" + s.Value
	}
	return strings.Join(parts, " ")
}

// Plots returns the two plots WritePlot draws, top first: the total hit rate and the pool
// occupancy of every run over trace time. Both have a title, axis labels with units, tick
// labels and a legend naming each run. lines[k] are plot k's lines, one per run that has points,
// in run order.
func Plots(rep *Report) (plots []*plot.Plot, lines [][]*plotter.Line, err error) {
	hit := plot.New()
	occ := plot.New()
	name := rep.Trace.Name
	if name == "" {
		name = "trace"
	}
	hit.Title.Text = fmt.Sprintf("kvctl replay of %s: hit rate", name)
	hit.X.Label.Text = "trace time (s)"
	hit.Y.Label.Text = "hit rate (% of input tokens)"
	occ.Title.Text = "pool occupancy"
	occ.X.Label.Text = "trace time (s)"
	occ.Y.Label.Text = "pool occupancy (% of capacity)"
	for _, p := range []*plot.Plot{hit, occ} {
		p.Y.Min, p.Y.Max = 0, 100
		// Ticks end at 100 %: WritePlot raises the axis above it to make a band for the legend.
		p.Y.Tick.Marker = plot.ConstantTicks{{Value: 0, Label: "0"}, {Value: 25}, {Value: 50, Label: "50"}, {Value: 75}, {Value: 100, Label: "100"}}
		p.Add(plotter.NewGrid())
		// Top left, inside the axes: a legend at the top right ran past the plot's edge.
		p.Legend.Top = true
		p.Legend.Left = true
		p.Legend.XOffs, p.Legend.YOffs = 3*vg.Millimeter, -2*vg.Millimeter
		p.Legend.ThumbnailWidth = vg.Points(28)
	}
	lines = make([][]*plotter.Line, 2)
	for i, run := range rep.Runs {
		var hits, occs plotter.XYs
		for _, tp := range run.Timeline {
			if tp.Requests > 0 {
				hits = append(hits, plotter.XY{X: tp.AtSec, Y: 100 * min(max(tp.LocalRate+tp.PoolRate, 0), 1)})
			}
			occs = append(occs, plotter.XY{X: tp.AtSec, Y: 100 * min(max(tp.Occupancy, 0), 1)})
		}
		label := RunLabel(run)
		for k, s := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{hit, hits}, {occ, occs}} {
			if len(s.xys) == 0 {
				continue
			}
			l, err := plotter.NewLine(s.xys)
			if err != nil {
				return nil, nil, fmt.Errorf("run %s: %w", label, err)
			}
			l.LineStyle = LineStyle(i)
			s.p.Add(l)
			s.p.Legend.Add(label, l)
			lines[k] = append(lines[k], l)
		}
	}
	// Both panels span the same trace time, so that their ticks line up: the hit panel has no
	// point for an interval without arrivals, the occupancy panel has one for every interval.
	xmin, xmax := min(hit.X.Min, occ.X.Min), max(hit.X.Max, occ.X.Max)
	for _, p := range []*plot.Plot{hit, occ} {
		p.X.Min, p.X.Max = xmin, xmax
	}
	return []*plot.Plot{hit, occ}, lines, nil
}

// WritePlot draws hit rate (top) and pool occupancy (bottom) over trace time as a PNG, one
// line style per run, with a legend naming each run's --set combination.
func WritePlot(w io.Writer, rep *Report) error {
	img := vgimg.NewWith(vgimg.UseWH(PlotWidth, PlotHeight), vgimg.UseDPI(plotDPI), vgimg.UseBackgroundColor(color.White))
	plots, canvases, err := arrange(rep, draw.New(img))
	if err != nil {
		return err
	}
	for i, p := range plots {
		p.Draw(canvases[i])
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// arrange lays the two plots out on dc, one above the other, and raises each y axis above 100 %
// by just enough for a band that holds the legend, so that no line runs under it (a full pool
// sits at the top of the occupancy panel). It returns each plot's canvas.
func arrange(rep *Report, dc draw.Canvas) ([]*plot.Plot, []draw.Canvas, error) {
	plots, _, err := Plots(rep)
	if err != nil {
		return nil, nil, err
	}
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	aligned := plot.Align([][]*plot.Plot{{plots[0]}, {plots[1]}}, tiles, dc)
	canvases := []draw.Canvas{aligned[0][0], aligned[1][0]}
	for i, p := range plots {
		// The data area does not depend on the y range (its ticks are fixed), so the band is
		// exact: the legend's height, its offset from the top and a millimetre of air.
		data := p.DataCanvas(canvases[i])
		h := data.Max.Y - data.Min.Y
		need := p.Legend.Rectangle(data).Size().Y - p.Legend.YOffs + vg.Millimeter
		if need > 0 && need < h/2 {
			p.Y.Max = 100 * float64(h/(h-need))
		}
	}
	return plots, canvases, nil
}
