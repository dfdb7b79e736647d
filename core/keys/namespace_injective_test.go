package keys

import (
	"strings"
	"testing"
)

// TestNamespaceKeepsItsBytes pins that a namespace is written into keys exactly as given, as
// TensorRT-LLM writes it: kvctl serve refuses a namespace holding '/' instead of rewriting it,
// so no key of a pool shared with TensorRT-LLM ever differs.
func TestNamespaceKeepsItsBytes(t *testing.T) {
	var h Hash
	h[0] = 7
	n := Namespace{Namespace: "ns/x", ModelKey: "m", WorldSize: 1}
	if got, want := n.PageKey(0, 16, 64, h), "ns/x/m/w1r0/lg0/t16b64/07000000000000000000000000000000"; got != want {
		t.Errorf("page key %q, want %q", got, want)
	}
}

// FuzzNamespaceInjective checks the property kvctl serve's namespace rule relies on: once the
// namespace holds no '/', two different (namespace, model key) pairs never write the same key,
// whatever '/' the model keys hold.
func FuzzNamespaceInjective(f *testing.F) {
	f.Add("ns", "x/m", "ns", "x")
	f.Add("trtllm", "llama/3", "trtllm", "llama")
	f.Add("a", "m/w1r0", "a", "m")
	f.Fuzz(func(t *testing.T, ns1, m1, ns2, m2 string) {
		if ns1 == "" || ns2 == "" || m1 == "" || m2 == "" || (ns1 == ns2 && m1 == m2) ||
			strings.Contains(ns1, "/") || strings.Contains(ns2, "/") {
			return
		}
		var h Hash
		a := Namespace{Namespace: ns1, ModelKey: m1, WorldSize: 1}
		b := Namespace{Namespace: ns2, ModelKey: m2, WorldSize: 1}
		groups := []LayerGroupPages{{Group: 0, BytesPerPage: 64, ReplicatedBytesPerPage: 8}}
		ka := append(a.BlockKeys(16, groups, h), a.GroupKey(h))
		kb := append(b.BlockKeys(16, groups, h), b.GroupKey(h))
		seen := make(map[string]bool, len(ka))
		for _, k := range ka {
			seen[k] = true
		}
		for _, k := range kb {
			if seen[k] {
				t.Fatalf("(%q, %q) and (%q, %q) share key %q", ns1, m1, ns2, m2, k)
			}
		}
	})
}
