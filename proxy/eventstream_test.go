package proxy

import (
	"context"
	"fmt"
	"testing"
)

// isEventStream decides whether a keyed answer streams (recorded without
// its body); its allocation-free pre-check must agree with the media type.
func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                  true,
		"Text/Event-Stream":                  true,
		"text/event-stream; charset=utf-8":   true,
		"  text/event-stream":                true,
		"\ttext/event-stream ;charset=utf-8": true,
		"text/event-streamx":                 false,
		"text/event-strea":                   false,
		"application/json":                   false,
		"":                                   false,
		"text/event-stream;;":                false, // malformed: not parsed as one
	} {
		if got := isEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v, want %v", ct, got, want)
		}
	}
}

// isTimeout runs on every keyed body read: no allocation when there is no
// error (errors.As's target escapes once declared).
func TestIsTimeoutNilDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = isTimeout(nil) }); n != 0 {
		t.Errorf("isTimeout(nil) allocates %v times, want 0", n)
	}
}

// context.DeadlineExceeded is a net.Error that times out: isTimeout alone
// gives upstreamAnswer and the trace their 504 / "timeout".
func TestIsTimeoutDeadlineExceeded(t *testing.T) {
	if !isTimeout(fmt.Errorf("round trip: %w", context.DeadlineExceeded)) {
		t.Error("isTimeout(wrapped context.DeadlineExceeded) = false")
	}
	if isTimeout(context.Canceled) {
		t.Error("isTimeout(context.Canceled) = true")
	}
}
