//go:build race

package disagg_test

// raceDetector: the race detector slows JSON work about tenfold, so the soak runs fewer
// requests with longer timeouts under it.
const raceDetector = true
