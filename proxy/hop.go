package proxy

import (
	"net/http"
	"net/textproto"
	"slices"
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
	out := make(map[string][]string, len(h))
	copyRecordable(out, h)
	return out
}

// copyRecordable copies the recordable headers of src (see
// recordableHeader) into dst. The value slices are shared with src (which
// the ReplayCache may share between requests), capped so that an append
// copies instead of writing into src.
func copyRecordable(dst http.Header, src map[string][]string) {
	var named []string // headers the Connection header names; rare
	for _, v := range src["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				named = append(named, http.CanonicalHeaderKey(f))
			}
		}
	}
	for k, vv := range src {
		if !strings.HasPrefix(k, http.TrailerPrefix) && !slices.Contains(hopHeaders, k) && !slices.Contains(named, k) {
			dst[k] = vv[:len(vv):len(vv)]
		}
	}
}
