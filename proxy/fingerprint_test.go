package proxy

import (
	"crypto/sha256"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestFingerprintAcrossSizes: a body hashed beside the fields and one hashed
// after them by a pooled hasher give the fingerprint of the fields and body
// as one message, on both sides of the boundary and with the path long
// enough to leave the stack buffer; records written by earlier versions keep
// matching, and concurrent hashers do not share a state.
func TestFingerprintAcrossSizes(t *testing.T) {
	paths := []string{"/orders", "/" + strings.Repeat("p", 300)}
	sizes := []int{0, 1, 200, 255, 256, 257, 4096, 4097, 70000}
	for _, path := range paths {
		for _, n := range sizes {
			body := []byte(strings.Repeat("x", n))
			r := httptest.NewRequest("POST", path+"?b=2&a=1", nil)
			strict := sha256.Sum256([]byte("POST\x00" + path + "\x00b=2&a=1\x00" + string(body)))
			if got := fingerprint(r, body, FingerprintStrict); got != strict {
				t.Errorf("strict, path %d bytes, body %d bytes: %x, want %x", len(path), n, got, strict)
			}
			// Not JSON: the body's bytes, after the sorted, length-prefixed query.
			jsonFP := sha256.Sum256([]byte("\x00json\x00POST\x00" + path + "\x00" + string(appendSortedQuery(nil, "b=2&a=1")) + "\x00b" + string(body)))
			if got := fingerprint(r, body, FingerprintJSON); got != jsonFP {
				t.Errorf("json, path %d bytes, body %d bytes: %x, want %x", len(path), n, got, jsonFP)
			}
			none := sha256.Sum256([]byte("\x00none\x00POST\x00" + path + "\x00"))
			if got := fingerprint(r, body, FingerprintNone); got != none {
				t.Errorf("none, path %d bytes, body %d bytes: %x, want %x", len(path), n, got, none)
			}
		}
	}

	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := []byte(strings.Repeat(string(rune('a'+g)), 5000))
			want := sha256.Sum256(append([]byte("POST\x00/c\x00\x00"), body...))
			r := httptest.NewRequest("POST", "/c", nil)
			for range 200 {
				if got := fingerprint(r, body, FingerprintStrict); got != want {
					t.Errorf("goroutine %d: %x, want %x", g, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}
