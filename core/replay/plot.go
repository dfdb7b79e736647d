package replay

import (
	"image"
	"image/color"
	"image/png"
	"io"
)

// plotColors are the runs' line colours, in run order (cycled past eight runs).
var plotColors = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xff, 0x7f, 0x0e, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
}

// WritePlot draws the report's timelines as a PNG: the top panel is the total hit rate (local
// plus pool) of the requests that arrived in each interval, the bottom panel the pool's
// occupancy at the end of each interval; both run from 0 to 1 over the trace's duration, with
// grid lines at every quarter. Each run has its colour, in run order.
func WritePlot(w io.Writer, rep *Report) error {
	const (
		width, height = 960, 600
		margin        = 24
		gap           = 24
	)
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fillRect(img, img.Bounds(), color.RGBA{0xff, 0xff, 0xff, 0xff})
	panelH := (height - 2*margin - gap) / 2
	panels := []image.Rectangle{
		image.Rect(margin, margin, width-margin, margin+panelH),
		image.Rect(margin, margin+panelH+gap, width-margin, margin+2*panelH+gap),
	}
	grid := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	axis := color.RGBA{0x44, 0x44, 0x44, 0xff}
	for _, p := range panels {
		for q := 1; q < 4; q++ {
			y := p.Max.Y - (p.Dy()*q)/4
			line(img, p.Min.X, y, p.Max.X, y, grid)
			x := p.Min.X + (p.Dx()*q)/4
			line(img, x, p.Min.Y, x, p.Max.Y, grid)
		}
		line(img, p.Min.X, p.Min.Y, p.Min.X, p.Max.Y, axis)
		line(img, p.Min.X, p.Max.Y, p.Max.X, p.Max.Y, axis)
		line(img, p.Min.X, p.Min.Y, p.Max.X, p.Min.Y, grid)
		line(img, p.Max.X, p.Min.Y, p.Max.X, p.Max.Y, grid)
	}
	for i, run := range rep.Runs {
		c := plotColors[i%len(plotColors)]
		n := len(run.Timeline)
		if n == 0 {
			continue
		}
		series := []func(TimePoint) (float64, bool){
			func(tp TimePoint) (float64, bool) { return tp.LocalRate + tp.PoolRate, tp.Requests > 0 },
			func(tp TimePoint) (float64, bool) { return tp.Occupancy, true },
		}
		for k, f := range series {
			p := panels[k]
			px, py, have := 0, 0, false
			for j, tp := range run.Timeline {
				v, ok := f(tp)
				if !ok {
					continue
				}
				v = min(max(v, 0), 1)
				x := p.Min.X + int(float64(p.Dx())*float64(j+1)/float64(n))
				y := p.Max.Y - int(float64(p.Dy())*v)
				if have {
					line(img, px, py, x, y, c)
				} else {
					fillRect(img, image.Rect(x-1, y-1, x+2, y+2), c)
				}
				px, py, have = x, y, true
			}
		}
	}
	return png.Encode(w, img)
}

func fillRect(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// line draws from (x0, y0) to (x1, y1), two pixels thick (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	err := dx + dy
	for {
		img.SetRGBA(x0, y0, c)
		img.SetRGBA(x0, y0+1, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
