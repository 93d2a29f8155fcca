package proxy

import (
	"net/http/httptest"
	"runtime"
	"testing"
)

// TestFingerprintScratchBoundsSmallRequests: fingerprintScratch promises
// to cover everything the json profile allocates, cold pools included, so
// that MAX_BUFFERED_BYTES bounds the heap. The hostile large bodies of
// TestFingerprintScratchBounds are covered; the commonest requests, small
// bodies and short queries, allocate about 1 KB more than is counted (the
// pooled hasher, the tagged writer and the query sorter's own struct are
// not in the sum).
func TestFingerprintScratchBoundsSmallRequests(t *testing.T) {
	for name, tc := range map[string]struct{ body, query string }{
		"small object":            {`{"a":1}`, ""},
		"empty body, short query": {"", "a=1"},
		"small body, short query": {"1", "b=2&a=1"},
	} {
		r := httptest.NewRequest("POST", "/x?"+tc.query, nil)
		body := []byte(tc.body)
		bound := fingerprintScratch(r, body, FingerprintJSON)
		fingerprint(r, body, FingerprintStrict) // package-level one-time initialisation out of the way
		runtime.GC()
		runtime.GC() // empties the pools
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fingerprint(r, body, FingerprintJSON)
		runtime.ReadMemStats(&after)
		if used := int64(after.TotalAlloc - before.TotalAlloc); used > bound {
			t.Errorf("%s: fingerprinting allocated %d bytes, over the %d counted", name, used, bound)
		}
	}
}
