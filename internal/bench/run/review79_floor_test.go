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
	cfg, code := parseFlags([]string{"-only", "floor", "-rounds", "1"})
	if code >= 0 {
		t.Fatalf("exit code %d", code)
	}
	smp := func(us float64) []floorSample {
		return []floorSample{{iterPerSec: 50000, redisUs: us, redisBusyPct: 50, readsPerIter: 0.05, cmdsPerRead: 42.6, driverPct: 50}}
	}
	floors := []floorResult{{mode: floorModes[0], samples: smp(10.6)}, {mode: floorModes[6], samples: smp(11.0)}}
	var verdict string
	for _, l := range floorReport(floors, cfg, nil) {
		if strings.HasPrefix(l, "floor  ") {
			verdict = l
		}
	}
	if strings.Contains(verdict, "-0.4 µs above") || !strings.Contains(verdict, "0.4 µs below it") {
		t.Errorf("want idemproxy's scripts 0.4 µs below onehash's:\n%s", verdict)
	}
}
