package replay

import (
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// maxExpandAlloc bounds what one Expand call may allocate: at most 256 configurations come
// back, so its work must not grow with the product of the --set value counts.
const maxExpandAlloc = 16 << 20

func countList(n int) string {
	vs := make([]string, n)
	for i := range vs {
		vs[i] = string(rune('1' + i%9))
	}
	return strings.Join(vs, ",")
}

// FuzzExpand feeds --set lists (one argument a line) to Expand. Every refusal wraps
// ErrBadSetting or ErrUnknownSetting; an accepted list gives the cartesian product of its
// values, at most 256 configurations, each named after its settings and equal to the base with
// those settings applied one by one; and a call allocates a bounded amount however many
// configurations the lists multiply out to.
func FuzzExpand(f *testing.F) {
	for _, s := range []string{
		"",
		"soft_pin_ttl_ms=0,600000",
		"ranks=1,2,4\nrouter=work-aware,pool-aware",
		"pool_size=64GiB,unlimited\neviction_ratio=0.05, 0.1\ngroup_blocks=true,false",
		"server=aggregated,context,generation\nscheduler=true",
		"local_reuse_backoff=off,align\ndraft_lookahead=0,3",
		"=1", "ranks=", "ranks=1,,2", "ranks=1\nranks=2", "nope=1", "ranks=0", "eviction_ratio=NaN",
		"ranks=" + countList(17) + "\ngpu_blocks=" + countList(16),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var sets []string
		if in != "" {
			sets = strings.Split(in, "\n")
		}
		base := DefaultConfig()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		cfgs, err := Expand(base, sets)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > maxExpandAlloc {
			t.Fatalf("Expand allocated %d bytes for %d bytes of settings", n, len(in))
		}
		if err != nil {
			if !errors.Is(err, ErrBadSetting) && !errors.Is(err, ErrUnknownSetting) {
				t.Fatalf("error %v wraps neither ErrBadSetting nor ErrUnknownSetting", err)
			}
			if cfgs != nil {
				t.Fatal("configurations and an error")
			}
			return
		}
		want := 1
		for _, s := range sets {
			_, vals, _ := strings.Cut(s, "=")
			want *= strings.Count(vals, ",") + 1
		}
		if len(cfgs) != want || len(cfgs) > 256 {
			t.Fatalf("%d configurations from %q, want %d", len(cfgs), sets, want)
		}
		for _, c := range cfgs {
			if len(c.Settings) != len(sets) {
				t.Fatalf("configuration %q has %d settings for %d --set lists", c.Name, len(c.Settings), len(sets))
			}
			parts := make([]string, len(c.Settings))
			applied := base
			for i, s := range c.Settings {
				parts[i] = s.Key + "=" + s.Value
				if err := applied.Set(s.Key, s.Value); err != nil {
					t.Fatalf("setting %s=%q of an accepted list does not apply: %v", s.Key, s.Value, err)
				}
			}
			if len(sets) > 0 && c.Name != strings.Join(parts, " ") {
				t.Fatalf("configuration named %q for settings %v", c.Name, c.Settings)
			}
			got := c
			got.Name, got.Settings = "", nil
			applied.Name, applied.Settings = "", nil
			if !reflect.DeepEqual(got, applied) {
				t.Fatalf("configuration %q differs from the base with its settings applied:\n%+v\n%+v", c.Name, got, applied)
			}
		}
	})
}
