package proxy

import (
	"net/http"
	"net/textproto"
	"strings"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 section 7.6.1 (the list
// of net/http/httputil's ReverseProxy). They describe one connection, so they
// are never recorded or replayed.
var hopHeaders = []string{
	"Connection",
	"Proxy-Connection",
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

// recordableHeader returns a copy of h without hop-by-hop headers, without
// any header that h's Connection header names, and without trailer
// placeholders. Set-Cookie stays: it is scoped to the caller, and the scope
// is part of the key.
func recordableHeader(h http.Header) map[string][]string {
	var named []string
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				named = append(named, http.CanonicalHeaderKey(f))
			}
		}
	}
	out := make(map[string][]string, len(h))
outer:
	for k, vv := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		for _, hop := range hopHeaders {
			if k == hop {
				continue outer
			}
		}
		for _, n := range named {
			if k == n {
				continue outer
			}
		}
		out[k] = vv
	}
	return out
}

// copyRecordable copies a recorded header into dst, skipping what
// recordableHeader would drop, without building an intermediate map. The
// value slices are shared with the record (which the ReplayCache may share
// between requests), capped so that an append copies instead of writing
// into the record.
func copyRecordable(dst http.Header, rec map[string][]string) {
	conn := rec["Connection"]
outer:
	for k, vv := range rec {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		for _, hop := range hopHeaders {
			if k == hop {
				continue outer
			}
		}
		for _, v := range conn {
			for f := range strings.SplitSeq(v, ",") {
				if http.CanonicalHeaderKey(textproto.TrimString(f)) == k {
					continue outer
				}
			}
		}
		dst[k] = vv[:len(vv):len(vv)]
	}
}
