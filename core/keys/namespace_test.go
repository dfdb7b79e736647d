package keys

import (
	"strings"
	"testing"
)

func testHash(t *testing.T) Hash {
	t.Helper()
	h, err := ParseHash("2cbd989e68a1d62fe8bebc04262e3dd9")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestNamespaceValidate(t *testing.T) {
	tests := []struct {
		name string
		ns   Namespace
		want []string
	}{
		{"empty model key", Namespace{WorldSize: 1}, []string{"model key is required"}},
		{"zero world", Namespace{ModelKey: "m"}, []string{"world size 0: must be at least 1"}},
		{"rank equal to world", Namespace{ModelKey: "m", WorldSize: 4, Rank: 4}, []string{"rank 4: must be in [0, 4)"}},
		{"rank above world", Namespace{ModelKey: "m", WorldSize: 2, Rank: 7}, []string{"rank 7"}},
		{"negative rank", Namespace{ModelKey: "m", WorldSize: 2, Rank: -1}, []string{"rank -1"}},
		{"rank checked under attention DP", Namespace{ModelKey: "m", WorldSize: 2, Rank: 2, AttentionDP: true}, []string{"rank 2"}},
		{"every problem at once", Namespace{WorldSize: 0, Rank: -1}, []string{"model key", "world size 0", "rank -1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ns.Validate()
			if err == nil {
				t.Fatal("Validate accepted the namespace")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	for _, ok := range []Namespace{{ModelKey: "m", WorldSize: 1}, {ModelKey: "m", WorldSize: 8, Rank: 7}, {Namespace: "x", ModelKey: "m", WorldSize: 8, Rank: 3, AttentionDP: true}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v): %v", ok, err)
		}
	}
}

func TestNamespaceKeys(t *testing.T) {
	h := testHash(t)
	const hx = "2cbd989e68a1d62fe8bebc04262e3dd9"
	tp := Namespace{ModelKey: "m", WorldSize: 8, Rank: 3}
	adp := Namespace{Namespace: "ns", ModelKey: "m", WorldSize: 8, Rank: 3, AttentionDP: true}
	checks := []struct{ got, want string }{
		{tp.Shard(), "w8r3"},
		{adp.Shard(), "w1r0"},
		{tp.PageKey(2, 32, 4096, h), "trtllm/m/w8r3/lg2/t32b4096/" + hx},
		{adp.PageKey(2, 32, 4096, h), "ns/m/w1r0/lg2/t32b4096/" + hx},
		{tp.PeerPageKey(5, 0, 16, 18446744073709551615, h), "trtllm/m/w8r5/lg0/t16b18446744073709551615/" + hx},
		{tp.ReplicatedPageKey(1, 4, 16384, h), "trtllm/m/replicated/lg1/t4b16384/" + hx},
		{adp.ReplicatedPageKey(1, 4, 16384, h), "ns/m/replicated/lg1/t4b16384/" + hx},
		{tp.GroupKey(h), "trtllm/m/w8/" + hx},
		{adp.GroupKey(h), "ns/m/w1/" + hx},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
}

func TestBlockAndSaveKeys(t *testing.T) {
	h := testHash(t)
	const hx = "/2cbd989e68a1d62fe8bebc04262e3dd9"
	groups := []LayerGroupPages{{Group: 0, BytesPerPage: 100}, {Group: 1, BytesPerPage: 200, ReplicatedBytesPerPage: 50}}
	tp := Namespace{ModelKey: "m", WorldSize: 2, Rank: 1}
	equalStrings(t, "block keys", tp.BlockKeys(4, groups, h), []string{
		"trtllm/m/w2r0/lg0/t4b100" + hx,
		"trtllm/m/w2r1/lg0/t4b100" + hx,
		"trtllm/m/w2r0/lg1/t4b200" + hx,
		"trtllm/m/w2r1/lg1/t4b200" + hx,
		"trtllm/m/replicated/lg1/t4b50" + hx,
	})
	equalStrings(t, "save keys of rank 1", tp.SaveKeys(4, groups, h), []string{
		"trtllm/m/w2r1/lg0/t4b100" + hx,
		"trtllm/m/w2r1/lg1/t4b200" + hx,
	})
	tp.Rank = 0
	equalStrings(t, "save keys of rank 0", tp.SaveKeys(4, groups, h), []string{
		"trtllm/m/w2r0/lg0/t4b100" + hx,
		"trtllm/m/w2r0/lg1/t4b200" + hx,
		"trtllm/m/replicated/lg1/t4b50" + hx,
	})
	adp := Namespace{ModelKey: "m", WorldSize: 2, Rank: 1, AttentionDP: true}
	want := []string{"trtllm/m/w1r0/lg0/t4b100" + hx, "trtllm/m/w1r0/lg1/t4b200" + hx, "trtllm/m/replicated/lg1/t4b50" + hx}
	equalStrings(t, "block keys under attention DP", adp.BlockKeys(4, groups, h), want)
	equalStrings(t, "save keys under attention DP", adp.SaveKeys(4, groups, h), want)

	dst := adp.AppendBlockKeys([]string{"keep"}, 4, groups, h)
	equalStrings(t, "appended block keys", dst, append([]string{"keep"}, want...))
	dst = adp.AppendSaveKeys(dst[:1], 4, groups[:1], h)
	equalStrings(t, "appended save keys", dst, []string{"keep", want[0]})
	if got := tp.BlockKeys(4, nil, h); len(got) != 0 {
		t.Errorf("no groups gave keys %q", got)
	}
	// The page key of the own shard is one of the block keys.
	if k := tp.PageKey(1, 4, 200, h); !strings.Contains(strings.Join(tp.BlockKeys(4, groups, h), "\n"), k) {
		t.Errorf("PageKey %s is not among the block keys", k)
	}
}
