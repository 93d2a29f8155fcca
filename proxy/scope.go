package proxy

import (
	"net/http"
	"strings"
)

// ScopeValues returns the values of the scope headers names (SCOPE_HEADERS,
// or a route's scope=) in h, as the proxy puts them into a key: one entry
// per name, in order (a name listed twice fills two entries), all of a
// header's values joined with "\n" (an empty one included), "" for an
// absent header. Host is host: net/http moves it out of the header map.
// The entries are appended to buf[:0], so that a caller's array avoids an
// allocation; buf may be nil.
//
// `idemproxy keys hash` builds h from its --scope flags and calls this, so
// that it prints the key_hash the proxy logs.
func ScopeValues(h http.Header, host string, names, buf []string) []string {
	vals := buf[:0]
	for range names {
		vals = append(vals, "")
	}
	for i, name := range names {
		if strings.EqualFold(name, "Host") {
			vals[i] = host
			continue
		}
		switch vv := h.Values(name); len(vv) {
		case 0:
		case 1:
			vals[i] = vv[0]
		default:
			vals[i] = strings.Join(vv, "\n")
		}
	}
	return vals
}
