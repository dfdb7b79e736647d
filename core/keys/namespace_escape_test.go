package keys

import "testing"

// TestNamespaceSlashIsUnambiguous pins the rule that keeps two (namespace, model) pairs from
// sharing keys: the namespace's '/' and '%' are escaped, so "ns/x"+"m" and "ns"+"x/m" differ in
// every key kind, while a namespace without them is written as is.
func TestNamespaceSlashIsUnambiguous(t *testing.T) {
	var h Hash
	h[0] = 7
	a := Namespace{Namespace: "ns/x", ModelKey: "m", WorldSize: 1}
	b := Namespace{Namespace: "ns", ModelKey: "x/m", WorldSize: 1}
	c := Namespace{Namespace: "ns%2Fx", ModelKey: "m", WorldSize: 1}
	groups := []LayerGroupPages{{Group: 0, BytesPerPage: 64, ReplicatedBytesPerPage: 8}}
	keysOf := func(n Namespace) []string {
		return append(n.BlockKeys(16, groups, h), n.GroupKey(h), n.PageKey(0, 16, 64, h), n.ReplicatedPageKey(0, 16, 8, h))
	}
	ka, kb, kc := keysOf(a), keysOf(b), keysOf(c)
	for i := range ka {
		if ka[i] == kb[i] || ka[i] == kc[i] || kb[i] == kc[i] {
			t.Errorf("key %d shared: %q %q %q", i, ka[i], kb[i], kc[i])
		}
	}
	if got, want := a.PageKey(0, 16, 64, h), "ns%2Fx/m/w1r0/lg0/t16b64/07000000000000000000000000000000"; got != want {
		t.Errorf("escaped namespace key %q, want %q", got, want)
	}
	if got, want := b.PageKey(0, 16, 64, h), "ns/x/m/w1r0/lg0/t16b64/07000000000000000000000000000000"; got != want {
		t.Errorf("plain namespace key %q, want %q", got, want)
	}
	for in, want := range map[string]string{"trtllm": "trtllm", "a/b": "a%2Fb", "a%b": "a%25b", "%2F": "%252F", "": ""} {
		if got := EscapeNamespace(in); got != want {
			t.Errorf("EscapeNamespace(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzNamespaceInjective checks that two different (namespace, model) pairs never produce the
// same page key.
func FuzzNamespaceInjective(f *testing.F) {
	f.Add("ns/x", "m", "ns", "x/m")
	f.Add("a%2Fb", "m", "a/b", "m")
	f.Add("trtllm", "llama/3", "trtllm/llama", "3")
	f.Fuzz(func(t *testing.T, ns1, m1, ns2, m2 string) {
		if ns1 == "" || ns2 == "" || m1 == "" || m2 == "" || (ns1 == ns2 && m1 == m2) {
			return
		}
		var h Hash
		a := Namespace{Namespace: ns1, ModelKey: m1, WorldSize: 1}
		b := Namespace{Namespace: ns2, ModelKey: m2, WorldSize: 1}
		if ka, kb := a.PageKey(0, 16, 64, h), b.PageKey(0, 16, 64, h); ka == kb {
			t.Fatalf("(%q, %q) and (%q, %q) share key %q", ns1, m1, ns2, m2, ka)
		}
	})
}
