package proxy

import (
	"mime"
	"testing"
)

// TestReview14bIsEventStreamAgreesWithParseMediaType: dccc30a's pre-check
// ("ParseMediaType trims only spaces before the type") trims only spaces
// and tabs, but mime.ParseMediaType trims with strings.TrimSpace: U+00A0
// and U+0085 too (and \v, \f, which net/http's client already refuses in
// a response header; NBSP and NEL, as UTF-8 obs-text, reach the proxy).
// For an upstream Content-Type beginning with one of those, isEventStream
// no longer agrees with the media type that httputil.ReverseProxy itself
// uses to stream the answer (flushInterval -1): the answer is streamed as
// an event stream yet buffered and recorded, where before dccc30a it was
// recorded without its body. The test of dccc30a states the contract:
// "its allocation-free pre-check must agree with the media type".
func TestReview14bIsEventStreamAgreesWithParseMediaType(t *testing.T) {
	for _, ct := range []string{
		"text/event-stream",
		" \ttext/event-stream; charset=utf-8",
		"\u00a0text/event-stream",
		"\u0085text/event-stream",
	} {
		mt, _, err := mime.ParseMediaType(ct)
		want := err == nil && mt == "text/event-stream" // ReverseProxy's test, and isEventStream's before dccc30a
		if got := isEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v; mime.ParseMediaType says %q (%v): want %v", ct, got, mt, err, want)
		}
	}
}
