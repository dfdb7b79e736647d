// Package mooncaketest serves the real Mooncake master's recorded HTTP responses to tests.
//
// The recordings live in mooncake/testdata/http/<state>/*.txt, one exchange a file: a line
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
