//go:build !race

package disagg_test

const raceDetector = false
