package proxy

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy/jcs"
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
//
// The json profile's work is bounded by fingerprintScratch, which the
// caller counts in the request's share of MAX_BUFFERED_BYTES first.
func fingerprint(r *http.Request, body []byte, prof Fingerprint) claim.Fingerprint {
	var small [256]byte // the fields, and a small body after them, without allocating
	b := small[:0]
	switch prof {
	case FingerprintJSON:
		return jsonFingerprint(r, body)
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

// jsonFingerprint is the json profile: the method and path, the query
// parameters sorted, and the body's RFC 8785 form when it has one (tagged
// j), its bytes otherwise (tagged b). Everything is streamed into the hash:
// neither the sorted query nor the canonical body is built in memory.
func jsonFingerprint(r *http.Request, body []byte) claim.Fingerprint {
	hs := hashers.Get().(*hasher)
	defer hs.put()
	var fields [256]byte
	b := append(fields[:0], "\x00json\x00"...)
	b = appendMethodPath(b, r)
	hs.h.Reset()
	hs.h.Write(b)
	writeSortedQuery(hs.h, r.URL.RawQuery)
	hs.h.Write([]byte{0})
	// jcs writes nothing unless the whole body canonicalises, so the tag
	// goes in with its first byte.
	tagged := &taggedWriter{w: hs.h, tag: 'j'}
	if len(body) == 0 || jcs.Write(tagged, body) != nil {
		hs.h.Write([]byte{'b'})
		hs.h.Write(body)
	}
	hs.h.Sum(hs.sum[:0])
	return hs.sum
}

// taggedWriter writes tag before the first bytes written to it.
type taggedWriter struct {
	w       io.Writer
	tag     byte
	started bool
}

func (t *taggedWriter) Write(p []byte) (int, error) {
	if !t.started && len(p) > 0 {
		t.started = true
		if _, err := t.w.Write([]byte{t.tag}); err != nil {
			return 0, err
		}
	}
	return t.w.Write(p)
}

// fingerprintScratch is what fingerprinting r and body with prof may hold
// in memory beyond them, at most: the json profile's canonical form of the
// body (jcs.ScratchBound) and its sorted query. The caller counts it in
// MAX_BUFFERED_BYTES before it fingerprints: hostile bodies must not grow
// the heap past the bound the proxy documents.
func fingerprintScratch(r *http.Request, body []byte, prof Fingerprint) int64 {
	if prof != FingerprintJSON {
		return 0
	}
	n := int64(fingerprintFixed)
	if len(body) > 0 {
		n += int64(jcs.Scratch(body))
	}
	return n + querySortScratch(len(r.URL.RawQuery))
}

// fingerprintFixed covers the small allocations of the json profile with
// cold pools: the hasher, the tagged writer, the query sorter itself.
const fingerprintFixed = 2 << 10

// MaxFingerprintScratch is the most fingerprintScratch counts for a body of
// maxBody bytes and a short query: what MAX_BUFFERED_BYTES must hold beside
// the body on a fingerprint=json route, so that one request of the largest
// size is never refused for want of room on an idle proxy.
func MaxFingerprintScratch(maxBody int64) int64 {
	return fingerprintFixed + int64(jcs.ScratchBound(int(min(maxBody, 1<<40)))) + querySortScratch(1<<10)
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
	hs.put()
	return fp
}

// put returns hs to the pool, unless a long path's copy grew it.
func (hs *hasher) put() {
	if cap(hs.pre) <= 1<<10 {
		hashers.Put(hs)
	}
}

func appendMethodPath(b []byte, r *http.Request) []byte {
	b = append(b, r.Method...)
	b = append(b, 0)
	b = append(b, r.URL.EscapedPath()...)
	return append(b, 0)
}

// writeSortedQuery writes the decoded query parameters sorted by name,
// then value, each length-prefixed, after a 'q'; a raw query that does not
// decode as url.ParseQuery would (a ";", a bad escape) is written as it
// is, after an 'r'. Nothing for an empty query. The pairs are decoded once
// into one buffer and sorted as spans of it: no map, no string per pair.
func writeSortedQuery(w io.Writer, raw string) {
	if raw == "" {
		return
	}
	qs := querySorters.Get().(*querySorter)
	defer qs.put()
	if !qs.parse(raw) {
		w.Write([]byte{'r'})
		io.WriteString(w, raw)
		return
	}
	slices.SortFunc(qs.pairs, func(a, c queryPair) int {
		if n := bytes.Compare(qs.text(a.k), qs.text(c.k)); n != 0 {
			return n
		}
		return bytes.Compare(qs.text(a.v), qs.text(c.v))
	})
	if cap(qs.out) < 4<<10 {
		qs.out = make([]byte, 0, 4<<10)
	}
	out := qs.out[:0]
	// emit goes through the fixed buffer; a part too long for it goes
	// straight to w.
	emit := func(p []byte) {
		if len(out)+len(p) > cap(out) {
			w.Write(out)
			out = out[:0]
			if len(p) > cap(out) {
				w.Write(p)
				return
			}
		}
		out = append(out, p...)
	}
	var num [24]byte
	emit([]byte{'q'})
	for _, p := range qs.pairs {
		k, v := qs.text(p.k), qs.text(p.v)
		emit(append(strconv.AppendInt(num[:0], int64(len(k)), 10), ':'))
		emit(k)
		emit(append(strconv.AppendInt(num[:0], int64(len(v)), 10), ':'))
		emit(v)
	}
	w.Write(out)
	qs.out = out[:0]
}

// querySortScratch bounds what writeSortedQuery holds for a raw query of n
// bytes: the decoded text (at most n), a pair of spans for each pair (at
// most n/2 pairs, "a&b&"), and its 4 KiB output buffer.
func querySortScratch(n int) int64 {
	if n == 0 {
		return 0
	}
	return int64(n) + int64(n/2+1)*int64(unsafe.Sizeof(queryPair{})) + 4<<10 + 64
}

// queryPair is a decoded key and value: [start, end) in querySorter.dec.
type queryPair struct{ k, v [2]int32 }

// querySorter is the scratch of writeSortedQuery, pooled.
type querySorter struct {
	dec   []byte
	pairs []queryPair
	out   []byte
}

var querySorters = sync.Pool{New: func() any { return new(querySorter) }}

// put returns the scratch to the pool, unless a long query grew it.
func (qs *querySorter) put() {
	if cap(qs.dec) <= 4<<10 && cap(qs.pairs) <= 256 && cap(qs.out) <= 8<<10 {
		querySorters.Put(qs)
	}
}

func (qs *querySorter) text(span [2]int32) []byte { return qs.dec[span[0]:span[1]] }

// parse decodes raw's pairs as url.ParseQuery does (split on "&", empty
// pairs skipped, key and value unescaped), or reports that it would fail.
func (qs *querySorter) parse(raw string) bool {
	if strings.IndexByte(raw, ';') >= 0 {
		return false
	}
	// Sized once, exactly: growing by appends would allocate about twice
	// what querySortScratch counts.
	n := 0
	for pair := range strings.SplitSeq(raw, "&") {
		if pair != "" {
			n++
		}
	}
	if cap(qs.pairs) < n {
		qs.pairs = make([]queryPair, 0, n)
	}
	if cap(qs.dec) < len(raw) {
		qs.dec = make([]byte, 0, len(raw))
	}
	qs.dec, qs.pairs = qs.dec[:0], qs.pairs[:0]
	for pair := range strings.SplitSeq(raw, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		var p queryPair
		var ok bool
		if p.k, ok = qs.unescape(k); !ok {
			return false
		}
		if p.v, ok = qs.unescape(v); !ok {
			return false
		}
		qs.pairs = append(qs.pairs, p)
	}
	return true
}

// unescape appends s decoded as url.QueryUnescape would ("+" is a space)
// to qs.dec and returns its span.
func (qs *querySorter) unescape(s string) ([2]int32, bool) {
	start := len(qs.dec)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '+':
			qs.dec = append(qs.dec, ' ')
		case '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return [2]int32{}, false
			}
			qs.dec = append(qs.dec, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			qs.dec = append(qs.dec, c)
		}
	}
	return [2]int32{int32(start), int32(len(qs.dec))}, true
}
