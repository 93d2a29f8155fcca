package main

import (
	"strings"
	"testing"
)

// Review 79: the verdict's "idemproxy's scripts X µs above it" is a
// difference of medians: a build whose scripts cost Redis less than
// onehash's (a prototype, or noise at 3 rounds) must read "below", not
// "-0.4 µs above".
func TestReview79FloorVerdictOnehashGapSign(t *testing.T) {
	verdict, _ := floorVerdict(t, []floorResult{{mode: floorModes[0], samples: floorSamples(10.6)}, {mode: floorModes[6], samples: floorSamples(11.0)}})
	if strings.Contains(verdict, "-0.4 µs above") || !strings.Contains(verdict, "0.4 µs below it") {
		t.Errorf("want idemproxy's scripts 0.4 µs below onehash's:\n%s", verdict)
	}
}

// floorSamples is one round of a floor mode at us µs of Redis per iteration.
func floorSamples(us float64) []floorSample {
	return []floorSample{{iterPerSec: 50000, redisUs: us, redisBusyPct: 50, readsPerIter: 0.05, cmdsPerRead: 42.6, driverPct: 50}}
}

// floorVerdict is the floor report of floors (-only floor -rounds 1): its
// verdict line, and every line.
func floorVerdict(t *testing.T, floors []floorResult) (verdict string, lines []string) {
	t.Helper()
	cfg, code := parseFlags([]string{"-only", "floor", "-rounds", "1"})
	if code >= 0 {
		t.Fatalf("exit code %d", code)
	}
	lines = floorReport(floors, cfg, nil)
	for _, l := range lines {
		if strings.HasPrefix(l, "floor  ") {
			verdict = l
		}
	}
	return verdict, lines
}
