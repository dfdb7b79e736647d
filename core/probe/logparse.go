package probe

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/core/statsapi"
)

// Stats-line messages.
const (
	msgHoles     = "prefix-hole stats"
	msgLoads     = "load stats"
	msgAsyncLoad = "async-load stats"
)

// LogStats is what the stats lines of a log add up to.
type LogStats struct {
	// Lines is every line read; HoleLines and LoadLines the stats lines folded in; Skipped the
	// lines that are not stats lines; Malformed the stats lines with a field that is not a
	// number (they are skipped too, and counted in Skipped).
	Lines, HoleLines, LoadLines, Skipped, Malformed int
	// FirstMalformed is the line number of the first malformed stats line, 0 when none.
	FirstMalformed int
	Holes          stats.HoleStats
	Loads          statsapi.LoadStatsJSON
}

// maxLogLine bounds one log line.
const maxLogLine = 1 << 20

// ParseLog folds the "prefix-hole stats" and "load stats" lines of r. It reads kvctl's own
// lines (slog text and JSON, as core/stats writes them), the lines of TensorRT-LLM's
// mooncake_store connector with mooncake_store.stats_interval set
// (https://github.com/NVIDIA/TensorRT-LLM/pull/21195: the same messages followed by key=value
// fields, under any logger prefix) and TensorRT-LLM's "async-load stats" summary. Every other line is skipped and counted.
func ParseLog(r io.Reader) (LogStats, error) {
	var ls LogStats
	ls.Loads.Phases = map[string]statsapi.PhaseJSON{}
	for p := stats.Phase(0); p < stats.NumPhases; p++ {
		ls.Loads.Phases[p.String()] = statsapi.PhaseJSON{}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLogLine)
	for sc.Scan() {
		ls.Lines++
		msg, fields, ok := splitLine(sc.Text())
		if !ok {
			ls.Skipped++
			continue
		}
		var err error
		switch msg {
		case msgHoles:
			err = ls.addHoles(fields)
		default:
			err = ls.addLoads(fields, msg == msgAsyncLoad)
		}
		if err != nil {
			ls.Skipped++
			ls.Malformed++
			if ls.FirstMalformed == 0 {
				ls.FirstMalformed = ls.Lines
			}
		}
	}
	if err := sc.Err(); err != nil {
		return ls, fmt.Errorf("line %d: %w", ls.Lines+1, err)
	}
	return ls, nil
}

// splitLine recognises a stats line and returns its message and its numeric-looking fields.
func splitLine(line string) (msg string, fields map[string]string, ok bool) {
	t := strings.TrimSpace(line)
	if strings.HasPrefix(t, "{") {
		var m map[string]any
		if json.Unmarshal([]byte(t), &m) != nil {
			return "", nil, false
		}
		s, _ := m["msg"].(string)
		if s != msgHoles && s != msgLoads {
			return "", nil, false
		}
		fields = map[string]string{}
		for k, v := range m {
			switch x := v.(type) {
			case float64:
				fields[k] = strconv.FormatFloat(x, 'g', -1, 64)
			case string:
				fields[k] = x
			}
		}
		return s, fields, true
	}
	if i := strings.Index(t, `msg="`); i >= 0 {
		rest := t[i+len(`msg="`):]
		for _, m := range []string{msgHoles, msgLoads} {
			if strings.HasPrefix(rest, m+`"`) {
				return m, parseKV(rest[len(m)+1:]), true
			}
		}
		return "", nil, false
	}
	for _, m := range []string{msgAsyncLoad, msgHoles, msgLoads} {
		if i := strings.Index(t, m); i >= 0 {
			return m, parseKV(t[i+len(m):]), true
		}
	}
	return "", nil, false
}

// parseKV reads key=value fields separated by spaces or commas; values may be double-quoted. A
// bare word before "mean=" and "max=" fields names them, as in "wait_ms mean=1.0 max=2.0".
func parseKV(s string) map[string]string {
	out := map[string]string{}
	prefix := ""
	for _, tok := range tokens(s) {
		k, v, ok := strings.Cut(tok, "=")
		if !ok {
			prefix = strings.TrimSuffix(tok, ":")
			continue
		}
		if (k == "mean" || k == "max") && prefix != "" {
			k = prefix + "_" + k
		} else {
			prefix = ""
		}
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		}
		out[k] = v
	}
	return out
}

func tokens(s string) []string {
	var out []string
	var b strings.Builder
	inQuote := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && inQuote && i+1 < len(s):
			b.WriteByte(c)
			i++
			b.WriteByte(s[i])
		case c == '"':
			inQuote = !inQuote
			b.WriteByte(c)
		case !inQuote && (c == ' ' || c == '\t' || c == ','):
			if b.Len() > 0 {
				out = append(out, b.String())
				b.Reset()
			}
		default:
			b.WriteByte(c)
		}
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// number reads the first of names present in f. It reports an error for a present field that
// is not a number.
func number(f map[string]string, names ...string) (float64, bool, error) {
	for _, n := range names {
		s, ok := f[n]
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return 0, false, fmt.Errorf("field %s=%q is not a number", n, s)
		}
		return v, true, nil
	}
	return 0, false, nil
}

type fieldReader struct {
	f   map[string]string
	err error
	any bool
}

func (r *fieldReader) get(names ...string) float64 {
	v, ok, err := number(r.f, names...)
	if err != nil && r.err == nil {
		r.err = err
	}
	r.any = r.any || ok
	return v
}

func (ls *LogStats) addHoles(f map[string]string) error {
	r := &fieldReader{f: f}
	h := stats.HoleStats{
		Lookups:                int64(r.get("lookups")),
		LookedUpBlocks:         int64(r.get("looked_up_blocks", "looked_up", "lookup_blocks", "blocks")),
		HitBlocks:              int64(r.get("hit_blocks", "hits", "hit")),
		Holes:                  int64(r.get("holes")),
		HoleBlocks:             int64(r.get("hole_blocks", "missing_blocks", "missing")),
		RecomputedStoredTokens: int64(r.get("recomputed_stored_tokens", "recomputed_tokens", "recomputed")),
	}
	if r.err != nil {
		return r.err
	}
	if !r.any {
		return fmt.Errorf("no prefix-hole fields")
	}
	ls.Holes.Add(h)
	ls.HoleLines++
	return nil
}

func (ls *LogStats) addLoads(f map[string]string, asyncLine bool) error {
	r := &fieldReader{f: f}
	loads := r.get("loads", "passes", "completed")
	async := r.get("async_loads")
	if asyncLine {
		async = loads
	}
	pages := r.get("pages")
	calls := r.get("store_calls", "calls")
	landed := r.get("landed_bytes", "loaded_bytes", "bytes")
	if gib, ok, err := number(f, "loaded_gib", "landed_gib"); err != nil {
		r.err = err
	} else if ok {
		landed, r.any = gib*(1<<30), true
	}
	failed := r.get("failed_pages")
	tMean := r.get("transfer_ms_mean", "transfer_mean_ms")
	tMax := r.get("transfer_ms_max", "transfer_max_ms")
	wMean := r.get("wait_ms_mean", "wait_mean_ms")
	wMax := r.get("wait_ms_max", "wait_max_ms")
	gpuCopy := r.get("gpu_copy_ms") / 1000
	gpuCheck := r.get("gpu_check_ms") / 1000
	phases := map[string]statsapi.PhaseJSON{}
	for p := stats.Phase(0); p < stats.NumPhases; p++ {
		n := p.String()
		wall := r.get(n+"_wall_ms", n+"_ms") / 1000
		if s, ok, err := number(f, n+"_wall_s", n+"_s"); err == nil && ok {
			wall, r.any = s, true
		}
		cpu := r.get(n+"_cpu_ms") / 1000
		if s, ok, err := number(f, n+"_cpu_s"); err == nil && ok {
			cpu, r.any = s, true
		}
		phases[n] = statsapi.PhaseJSON{WallSeconds: wall, CPUSeconds: cpu}
	}
	if r.err != nil {
		return r.err
	}
	if !r.any {
		return fmt.Errorf("no load fields")
	}
	l := &ls.Loads
	l.Loads += int64(loads)
	l.AsyncLoads += int64(async)
	l.Pages += int64(pages)
	l.StoreCalls += int64(calls)
	l.LandedBytes += int64(landed)
	l.FailedPages += int64(failed)
	l.TransferSeconds += tMean * loads / 1000
	l.TransferMaxSecs = max(l.TransferMaxSecs, tMax/1000)
	l.WaitSeconds += wMean * async / 1000
	l.WaitMaxSeconds = max(l.WaitMaxSeconds, wMax/1000)
	l.GPUCopySeconds += gpuCopy
	l.GPUCheckSeconds += gpuCheck
	for n, p := range phases {
		q := l.Phases[n]
		q.WallSeconds += p.WallSeconds
		q.CPUSeconds += p.CPUSeconds
		l.Phases[n] = q
	}
	ls.LoadLines++
	return nil
}
