package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/statsapi"
)

// chromium finds a headless-capable Chromium: $KVCTL_CHROMIUM, else chromium or
// chromium-browser on PATH. Without one the test skips, except under CI=true.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KVCTL_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no Chromium on PATH: .ci/run installs the Debian package chromium")
	}
	t.Skip("no Chromium on PATH (apt-get install chromium, as .ci/run does)")
	return ""
}

// headless runs Chromium headless with args and returns its standard output.
func headless(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--hide-scrollbars", "--force-device-scale-factor=1"}, args...)
	cmd := exec.CommandContext(ctx, bin, all...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.Bytes()
}

// TestStatusPageInChromium loads the status page of a real kvctl serve that served engines into
// a real headless Chromium: the DOM Chromium built shows the figures /v1/stats reports, and a
// phone-sized screenshot is drawn (not blank, the occupancy chart and badges in colour).
// KVCTL_UPDATE_SCREENSHOTS=1 writes the screenshot to docs/status-page.png.
func TestStatusPageInChromium(t *testing.T) {
	bin := chromium(t)
	socket := shortSocket(t)
	p := startServe(t, socket)
	ctx := context.Background()
	const T = 16
	for i, name := range []string{"prefill-0", "prefill-1"} {
		e, err := enginesim.Start(ctx, enginesim.Config{Socket: socket, ModelKey: "llama-3-8b", Name: name, TokensPerBlock: T, Slots: 1024, World: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close(ctx)
		reqs := simPrompts(uint64(20+i), 30, T, name)
		for pass := range 2 {
			if _, err := e.Run(ctx, renamedPrompts(reqs[:20+5*pass], strconv.Itoa(pass)), 4); err != nil {
				t.Fatal(err)
			}
		}
	}
	base := "http://" + p.admin
	code, body, _ := httpGet(t, base+"/v1/stats")
	if code != 200 {
		t.Fatalf("/v1/stats: %d", code)
	}
	var st statsapi.StatsJSON
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}

	dom := string(headless(t, bin, "--dump-dom", base+"/"))
	if !strings.Contains(dom, "<svg id=\"occupancy-chart\"") || strings.Contains(strings.ToLower(dom), "<script") {
		t.Fatalf("Chromium's DOM lacks the chart or has a script:\n%.2000s", dom)
	}
	re := regexp.MustCompile(`id="([a-z-]+)"[^>]*data-value="([^"]*)"`)
	got := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(dom, -1) {
		got[m[1]] = m[2]
	}
	want := map[string]string{
		"pool-used": strconv.FormatInt(st.Pool.UsedBytes, 10), "pool-capacity": strconv.FormatInt(st.Pool.CapacityBytes, 10),
		"pool-objects": strconv.FormatInt(st.Pool.Objects, 10), "holes-hit-blocks": strconv.FormatInt(st.PrefixHoles.HitBlocks, 10),
		"holes-holes": strconv.FormatInt(st.PrefixHoles.Holes, 10), "load-pages": strconv.FormatInt(st.Loads.Pages, 10),
		"save-pages": strconv.FormatInt(st.Saves.PutPages, 10), "engine-count": strconv.Itoa(len(st.Engines)),
		"hit-total": strconv.FormatFloat(st.HitRates.Total, 'g', -1, 64), "prompt-tokens": strconv.FormatInt(st.HitRates.PromptTokens, 10),
		"ready": "true", "pool-health": "true",
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("Chromium shows %s = %q, /v1/stats says %q", id, got[id], w)
		}
	}
	if st.PrefixHoles.HitBlocks == 0 || len(st.Engines) != 2 {
		t.Errorf("the workload did not reach the page: %+v", st)
	}
	for _, e := range st.Engines {
		if !strings.Contains(dom, `data-engine="`+e.Engine+`" data-model="llama-3-8b" data-rank="0"`) {
			t.Errorf("Chromium's DOM lacks engine %s", e.Engine)
		}
	}

	shot := filepath.Join(t.TempDir(), "status.png")
	headless(t, bin, "--window-size=412,1600", "--screenshot="+shot, base+"/")
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 412 || b.Dy() != 1600 {
		t.Errorf("screenshot is %v, want 412x1600 (a phone's width)", b)
	}
	if n, coloured := colours(img); n < 50 || !coloured {
		t.Errorf("screenshot has %d colours, coloured pixels %v: the page did not render", n, coloured)
	}
	if os.Getenv("KVCTL_UPDATE_SCREENSHOTS") == "1" {
		data, _ := os.ReadFile(shot)
		if err := os.WriteFile("../../docs/status-page.png", data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// colours counts the distinct colours of img and whether any pixel is strongly coloured (the
// accent blue of the chart, the green of the badges), not only greys.
func colours(img image.Image) (int, bool) {
	seen := map[uint32]bool{}
	coloured := false
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			r, g, bl = r>>8, g>>8, bl>>8
			seen[r<<16|g<<8|bl] = true
			if max(r, g, bl)-min(r, g, bl) > 80 {
				coloured = true
			}
		}
	}
	return len(seen), coloured
}
