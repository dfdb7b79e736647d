package cmdutil

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseGroups fuzzes --layer-group and --replicated (one flag value a line, the two lists
// split at the first empty line). Every refusal is a usage error (*FlagError); accepted flags
// give one geometry per --layer-group in flag order, with distinct groups and positive page
// sizes, and the geometries written back as flags parse to the same.
func FuzzParseGroups(f *testing.F) {
	for _, s := range []string{
		"0:131072",
		"1:128KiB\n0:64\n\n1:16",
		"0:1MiB\n1:1MiB\n2:2MiB\n\n0:4096\n2:4096",
		" 3 : 512 \n\n 3 : 8 ",
		"0:64\n0:64", "0:0", "-1:64", "x:64", "0:1GB", "0", "\n0:64", "0:64\n\n1:16", "0:64\n\n0:1\n0:2",
		"0:99999999999999999999", "9223372036854775808:1",
	} {
		f.Add(s)
	}
	lines := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, "\n")
	}
	f.Fuzz(func(t *testing.T, in string) {
		g, r, _ := strings.Cut(in, "\n\n")
		groups, replicated := lines(g), lines(r)
		out, err := parseGroups(groups, replicated)
		if err != nil {
			var fe *FlagError
			if !errors.As(err, &fe) {
				t.Fatalf("refusal %v is not a usage error", err)
			}
			return
		}
		if len(out) != len(groups) {
			t.Fatalf("%d geometries from %d --layer-group flags", len(out), len(groups))
		}
		seen := map[int]bool{}
		var again, againRep []string
		for _, p := range out {
			if seen[p.Group] || p.Group < 0 || p.BytesPerPage == 0 {
				t.Fatalf("accepted %+v from %q", out, in)
			}
			seen[p.Group] = true
			again = append(again, strconv.Itoa(p.Group)+":"+strconv.FormatUint(p.BytesPerPage, 10))
			if p.ReplicatedBytesPerPage != 0 {
				againRep = append(againRep, strconv.Itoa(p.Group)+":"+strconv.FormatUint(p.ReplicatedBytesPerPage, 10))
			}
		}
		if len(againRep) != len(replicated) {
			t.Fatalf("%d replicated sizes from %d --replicated flags", len(againRep), len(replicated))
		}
		back, err := parseGroups(again, againRep)
		if err != nil || !slices.Equal(back, out) {
			t.Fatalf("%+v written as %q %q reads back as %+v, %v", out, again, againRep, back, err)
		}
	})
}
