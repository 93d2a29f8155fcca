package main

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// The doc comment ("A write that fails keeps what it did not write for the
// next one") and README ("what it did not take is tried again") promise a
// retry; a warning written at once because nothing was gathered is not
// kept, while the same warning after one gathered info line is. Whether a
// failed warning survives depends on the traffic before it.
func TestReviewLB2FailedWarningRetriedOnlyIfInfoWasGathered(t *testing.T) {
	old := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(error) {}
	defer func() { zerolog.ErrorHandler = old }()
	for _, withInfo := range []bool{true, false} {
		w := &flaky{fails: 1}
		b := newLogBuffer(w, time.Hour, 1<<20)
		l := zerolog.New(b)
		if withInfo {
			l.Info().Msg("before")
		}
		l.Warn().Msg("disk full") // its write fails
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(w.String(), "disk full") {
			t.Errorf("gathered info before it: %v: the failed warning was not tried again (output %q)", withInfo, w.String())
		}
	}
}
