package proxy

import (
	"crypto/sha256"
	"fmt"
	"hash"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

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
	var small [256]byte // the fields, and a small body after them, without allocating
	b := small[:0]
	switch prof {
	case FingerprintJSON:
		b = append(b, "\x00json\x00"...)
		b = appendMethodPath(b, r)
		b = appendSortedQuery(b, r.URL.RawQuery)
		b = append(b, 0)
		if canon, ok := canonicalJSON(body); ok {
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
	if len(b)+len(body) <= len(small) {
		return sha256.Sum256(append(b, body...))
	}
	return hashPair(b, body)
}

// hasher is a SHA-256 state kept in a pool, with room for its input's
// first part and its sum: a larger body is hashed after the fields without
// being copied next to them. (The fields' stack buffer used to be 4 KiB: it
// took every connection's goroutine past its first stack, which the GC
// shrank back while the connection idled, so that under load the stack was
// copied on a large share of requests. The fields are copied here because
// what is written to a hash.Hash escapes, and the stack buffer with it.)
type hasher struct {
	h   hash.Hash
	pre []byte
	sum claim.Fingerprint
}

var hashers = sync.Pool{New: func() any { return &hasher{h: sha256.New()} }}

// hashPair is SHA-256 of a then b, as if they were one slice.
func hashPair(a, b []byte) claim.Fingerprint {
	hs := hashers.Get().(*hasher)
	hs.pre = append(hs.pre[:0], a...)
	hs.h.Reset()
	hs.h.Write(hs.pre)
	hs.h.Write(b)
	hs.h.Sum(hs.sum[:0])
	fp := hs.sum
	if cap(hs.pre) <= 1<<10 { // a long path's copy is not kept
		hashers.Put(hs)
	}
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

// maxCanonicalBytes bounds the bodies fingerprint=json canonicalises: the
// JCS library builds a tree of about 100 times the body's size. Larger
// bodies are compared byte for byte.
const maxCanonicalBytes = 64 << 10

// canonicalJSON is body's RFC 8785 form, when body is JSON of at most
// maxCanonicalBytes whose every number survives the trip through a double
// (JCS writes numbers as IEEE 754 doubles: 820982911946154508 and ...509
// would compare equal). Otherwise ok is false and the bytes are compared.
func canonicalJSON(body []byte) ([]byte, bool) {
	if len(body) == 0 || len(body) > maxCanonicalBytes || !numbersFitDoubles(body) {
		return nil, false
	}
	canon, err := jcs.Transform(body)
	return canon, err == nil
}

// numbersFitDoubles reports whether every number literal in the JSON text
// has at most 15 significant digits and a decimal exponent within the
// normal double range: such decimals map to distinct doubles, so equal
// canonical forms mean equal numbers.
func numbersFitDoubles(doc []byte) bool {
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case c == '"':
			for i++; i < len(doc) && doc[i] != '"'; i++ {
				if doc[i] == '\\' {
					i++
				}
			}
		case c == '-' || (c >= '0' && c <= '9'):
			j := i
			for j < len(doc) && strings.IndexByte("+-0123456789.eE", doc[j]) >= 0 {
				j++
			}
			if !numberFitsDouble(doc[i:j]) {
				return false
			}
			i = j - 1
		}
	}
	return true
}

func numberFitsDouble(n []byte) bool {
	digits, lead, exp, seenDot, fracDigits := 0, true, 0, false, 0
	i := 0
	for ; i < len(n) && n[i] != 'e' && n[i] != 'E'; i++ {
		switch c := n[i]; {
		case c == '.':
			seenDot = true
		case c >= '0' && c <= '9':
			if seenDot {
				fracDigits++
			}
			if lead && c == '0' {
				continue
			}
			lead = false
			digits++
		}
	}
	if i < len(n) {
		e := 0
		neg := false
		for _, c := range n[i+1:] {
			switch {
			case c == '-':
				neg = true
			case c >= '0' && c <= '9':
				if e < 100000 {
					e = e*10 + int(c-'0')
				}
			}
		}
		if neg {
			e = -e
		}
		exp = e
	}
	if digits == 0 {
		return true // zero, however written
	}
	mag := exp - fracDigits + digits // decimal magnitude of the leading digit, roughly
	return digits <= 15 && mag > -300 && mag < 300
}
