// Package mooncaketest gives tests a real Mooncake to talk to, and the real master's recorded
// HTTP responses.
//
// Real processes: StartMaster runs the real mooncake_master (from the Python environment that
// `make pyenv` builds, found through KVCTL_PYENV) on free loopback ports, with its RPC port,
// HTTP metadata server and metrics/admin server, and kills it in t.Cleanup. Master.Kill and
// Master.Restart (same ports, empty store) serve fault tests. StartClient runs Mooncake's own
// Python store client (MooncakeDistributedStore, TCP protocol) in a long-lived process of its
// own, so its segment stays mounted while kvctl reads from it; values cross through files.
// Without the environment the tests skip with a message naming `make pyenv`; with CI=true they
// fail instead.
//
//	m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
//	py := mooncaketest.StartClient(t, m, mooncaketest.ClientOptions{SegmentSize: 64 << 20})
//	py.Put("key", value, mooncaketest.PutOptions{SoftPin: true})
//
// Recordings: they live in mooncake/testdata/http/<state>/*.txt, one exchange a file: a line
// "### METHOD URL" naming the request, a line "### recorded TIME", then the master's raw HTTP
// response. State is "empty" (a master with nothing stored) or "populated". A test replays them
// from an httptest.Server:
//
//	rec := mooncaketest.Load(t, "populated", "query_key.txt")
//	srv := mooncaketest.ReplayServer(t, map[string]mooncaketest.Recording{"/query_key": rec},
//		mooncaketest.Load(t, "populated", "not_found_path.txt"))
//
// The package is for tests only; nothing outside _test.go files imports it.
package mooncaketest
