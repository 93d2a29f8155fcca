package claim

import "testing"

// The replay cache bounds itself with recordSize, which counts the encoded
// record, the body and the headers, but not Record.Trace: with tracing on,
// every cached replay holds 49 more bytes (plus a string header) than
// REPLAY_CACHE_BYTES accounts for.
func TestReview13RecordSizeCountsTrace(t *testing.T) {
	const tr = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	plain := recordSize(&Record{Status: 201, Body: []byte(`{}`)}, 16)
	traced := recordSize(&Record{Status: 201, Body: []byte(`{}`), Trace: tr}, 16)
	if traced < plain+len(tr) {
		t.Errorf("recordSize with a Trace: got %d, want at least %d (%d without, plus the %d-byte trace)", traced, plain+len(tr), plain, len(tr))
	}
}
