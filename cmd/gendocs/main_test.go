package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Regenerating unchanged pages keeps their dates, so `make verify` reproduces the committed
// pages on any day; a page whose text changed takes the day it was regenerated.
func TestManDatesKeptUnlessTheTextChanged(t *testing.T) {
	first, second := t.TempDir(), t.TempDir()
	jan := time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC)
	if err := run(filepath.Join(first, "man"), filepath.Join(first, "comp"), filepath.Join(first, "none"), jan); err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(first, "man", "kvctl-serve.1")
	orig, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(orig, []byte(`"Jan 2026"`)) {
		t.Fatalf("first generation not dated Jan 2026:\n%s", orig[:120])
	}
	// Another page's text changes in the previous set: only it takes the new date.
	hashPage := filepath.Join(first, "man", "kvctl-hash.1")
	h, err := os.ReadFile(hashPage)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hashPage, append(h, ".PP\nan older text\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	dec := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if err := run(filepath.Join(second, "man"), filepath.Join(second, "comp"), filepath.Join(first, "man"), dec); err != nil {
		t.Fatal(err)
	}
	again, err := os.ReadFile(filepath.Join(second, "man", "kvctl-serve.1"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, orig) {
		t.Errorf("an unchanged page was not reproduced byte for byte")
	}
	changed, err := os.ReadFile(filepath.Join(second, "man", "kvctl-hash.1"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(changed, []byte(`"Dec 2026"`)) {
		t.Errorf("a page whose text changed kept its old date")
	}
}
