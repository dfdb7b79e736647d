package mooncaketest

import "testing"

// TestMissingLibrary: a master that cannot load a shared library is told apart from one that
// fails otherwise, by the dynamic loader's line in its log.
func TestMissingLibrary(t *testing.T) {
	log := "=== start /x/bin/mooncake_master --rpc_port=1\n" +
		"/x/mooncake_master: error while loading shared libraries: libibverbs.so.1: cannot open shared object file: No such file or directory\n" +
		"=== killed\n"
	if got, want := missingLibrary(log), "error while loading shared libraries: libibverbs.so.1: cannot open shared object file: No such file or directory"; got != want {
		t.Fatalf("missingLibrary = %q, want %q", got, want)
	}
	if got := missingLibrary("=== start\nE1202 bind: address already in use\n=== killed\n"); got != "" {
		t.Fatalf("missingLibrary of a failure to bind = %q, want none", got)
	}
}
