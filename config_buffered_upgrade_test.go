package main

import (
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestMaxBufferedBytesUnsetHoldsOneRequest: MAX_BODY_BYTES and
// MAX_STORED_RESPONSE_BYTES were each valid up to 64 MiB before
// MAX_BUFFERED_BYTES existed. Left unset, its default grows to hold one
// request of those sizes, so that such a configuration still starts (found
// by review: it exited at start, the chart aside).
func TestMaxBufferedBytesUnsetHoldsOneRequest(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	for _, env := range [][]string{
		{up, "MAX_BODY_BYTES=16777216", "MAX_STORED_RESPONSE_BYTES=16777216"},
		{up, "MAX_BODY_BYTES=33554432"},
		{up, "MAX_STORED_RESPONSE_BYTES=67108864"},
	} {
		cfg, err := loadConfig(env)
		if err != nil {
			t.Errorf("%q (valid before MAX_BUFFERED_BYTES existed, which it does not set): refused at start:\n%v", env[1:], err)
			continue
		}
		if one := cfg.MaxBodyBytes + proxy.BodyChunk + cfg.MaxStoredResponseBytes; cfg.MaxBufferedBytes < one {
			t.Errorf("%q: MAX_BUFFERED_BYTES defaulted to %d, below one request's %d", env[1:], cfg.MaxBufferedBytes, one)
		}
	}
}
