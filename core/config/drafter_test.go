package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Seed commits 5 and 14: the drafter allow-list validate-config applies and kvctl serve applies
// to a registration are one rule. Every speculative fixture's drafter kind passes
// CheckSpeculativePrefillDrafter exactly when validate-config accepts its drafter, and the
// kinds an engine states over the engine API are the ones DrafterKind names.
func TestDrafterAllowListIsShared(t *testing.T) {
	for _, c := range []struct {
		fixture string
		kind    string
		allowed bool
	}{
		{"valid/spec-prefill.yaml", DrafterMTP, true},
		{"valid/spec-capacity-mtp.yaml", DrafterMTP, true},
		{"valid/spec-capacity-eagle3.yaml", DrafterEagle3, true},
		{"invalid/spec-not-one-model.yaml", "eagle3-two-model", false},
		{"invalid/spec-capacity-eagle3-two-model.yaml", "eagle3-two-model", false},
		{"invalid/spec-ngram.yaml", "ngram", false},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", c.fixture))
			if err != nil {
				t.Fatal(err)
			}
			f, diags := Load(c.fixture, data, LoadOptions{})
			if f == nil || f.TRTLLM == nil || f.TRTLLM.Speculative == nil {
				t.Fatalf("no speculative_config: %v", diags)
			}
			kind := f.TRTLLM.Speculative.DrafterKind()
			if kind != c.kind {
				t.Fatalf("drafter kind %q, want %q", kind, c.kind)
			}
			err = CheckSpeculativePrefillDrafter(kind)
			if (err == nil) != c.allowed {
				t.Fatalf("allow-list on %q = %v, want allowed %v", kind, err, c.allowed)
			}
			if err != nil && !errors.Is(err, ErrDrafterRefused) {
				t.Fatalf("refusal %v is not ErrDrafterRefused", err)
			}
			refusedDrafter := false
			for _, d := range diags {
				if d.Severity == SeverityError && (d.Path == pSpec+".decoding_type" || d.Path == pSpec+".mtp_eagle_one_model" || d.Path == pSpec+".eagle3_one_model") {
					refusedDrafter = true
				}
			}
			if refusedDrafter == c.allowed {
				t.Fatalf("validate-config refused the drafter: %v, want %v (%v)", refusedDrafter, !c.allowed, diags)
			}
		})
	}
}
