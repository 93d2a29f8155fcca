package proxy

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/gowebpki/jcs"

	"github.com/idemproxy/idemproxy/claim"
)

// Fingerprint is what makes two requests with one key "the same"
// (FINGERPRINT, route option fingerprint=).
type Fingerprint uint8

const (
	// FingerprintStrict compares the method, the escaped path, the raw query
	// as sent and the body bytes.
	FingerprintStrict Fingerprint = iota
	// FingerprintJSON compares the method, the path, the decoded query
	// parameters sorted, and the body's RFC 8785 (JCS) canonical form when
	// it parses as JSON (its bytes otherwise).
	FingerprintJSON
	// FingerprintNone compares the method and the path only.
	FingerprintNone
)

var fingerprintNames = [...]string{"strict", "json", "none"}

func (f Fingerprint) String() string { return fingerprintNames[f] }

// ParseFingerprint parses strict, json or none.
func ParseFingerprint(s string) (Fingerprint, error) {
	for i, n := range fingerprintNames {
		if s == n {
			return Fingerprint(i), nil
		}
	}
	return 0, fmt.Errorf("%q: want strict, json or none", s)
}

// fingerprint hashes what the profile compares. NUL separates the fields,
// which none of the first three can contain. The strict form is the one
// records were always written with; the others start with a profile tag,
// so no two profiles ever produce one fingerprint.
func fingerprint(r *http.Request, body []byte, prof Fingerprint) claim.Fingerprint {
	var stack [4096]byte // small requests are hashed in one go, without allocating
	b := stack[:0]
	switch prof {
	case FingerprintJSON:
		b = append(b, "\x00json\x00"...)
		b = appendMethodPath(b, r)
		b = appendSortedQuery(b, r.URL.RawQuery)
		b = append(b, 0)
		if canon, err := jcs.Transform(body); err == nil && len(body) > 0 {
			b = append(b, 'j')
			body = canon
		} else {
			b = append(b, 'b')
		}
	case FingerprintNone:
		b = append(b, "\x00none\x00"...)
		b = appendMethodPath(b, r)
		return sha256.Sum256(b)
	default:
		b = appendMethodPath(b, r)
		b = append(b, r.URL.RawQuery...)
		b = append(b, 0)
	}
	if len(b)+len(body) <= len(stack) {
		return sha256.Sum256(append(b, body...))
	}
	h := sha256.New()
	h.Write(b)
	h.Write(body)
	var fp claim.Fingerprint
	h.Sum(fp[:0])
	return fp
}

func appendMethodPath(b []byte, r *http.Request) []byte {
	b = append(b, r.Method...)
	b = append(b, 0)
	b = append(b, r.URL.EscapedPath()...)
	return append(b, 0)
}

// appendSortedQuery writes the decoded query parameters sorted by name,
// then value, each length-prefixed (a raw query that does not decode is
// written as it is, tagged so).
func appendSortedQuery(b []byte, raw string) []byte {
	if raw == "" {
		return b
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		b = append(b, 'r')
		return append(b, raw...)
	}
	type kv struct{ k, v string }
	var pairs []kv
	for k, vv := range q {
		for _, v := range vv {
			pairs = append(pairs, kv{k, v})
		}
	}
	slices.SortFunc(pairs, func(a, c kv) int {
		if n := strings.Compare(a.k, c.k); n != 0 {
			return n
		}
		return strings.Compare(a.v, c.v)
	})
	b = append(b, 'q')
	for _, p := range pairs {
		b = fmt.Appendf(b, "%d:%s%d:%s", len(p.k), p.k, len(p.v), p.v)
	}
	return b
}
