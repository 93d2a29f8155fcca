package proxy

import (
	"io"
	"net/http"
)

// trailerCopy passes a streamed request's trailers on. ReverseProxy copies
// the request's Trailer map before the body is read, and net/http's server
// fills in the values only when the body's end is read: the Transport would
// send the announced names without values. At that end, on the Transport's
// writing goroutine (which sends the trailers next), the values of the names
// out holds (announced, and not denied: Handler.rewrite) are copied over.
// Trailers the client did not announce are not forwarded, keyed or not.
type trailerCopy struct {
	io.ReadCloser
	in, out http.Header
}

func (t *trailerCopy) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if err == io.EOF {
		for k := range t.out {
			if v := t.in[k]; len(v) > 0 {
				t.out[k] = v
			}
		}
	}
	return n, err
}

// announcedTrailers are the trailers of a keyed request (its body read)
// that the client announced, with a value; nil for none.
func announcedTrailers(tr http.Header, names []string) http.Header {
	var out http.Header
	for _, k := range names {
		if v := tr[k]; len(v) > 0 {
			if out == nil {
				out = http.Header{}
			}
			out[k] = v
		}
	}
	return out
}

// trailerDenied names the request trailer fields that are not forwarded:
// those RFC 9110 (section 6.5.1) keeps out of trailers (framing, routing,
// connection, authentication, content metadata), and those the proxy reads
// or sets as headers (own: the key, the scope, a route's key=header:
// sources; and X-Forwarded-*): an upstream that merged trailers into its
// headers, against the RFC, must not find a client's value there in their
// place.
func trailerDenied(own []string) map[string]bool {
	deny := map[string]bool{}
	for _, k := range append([]string{
		"Authorization", "Cache-Control", "Connection", "Content-Encoding", "Content-Length", "Content-Range",
		"Content-Type", "Cookie", "Expect", "Forwarded", "Host", "Idempotency-Key", "Keep-Alive", "Max-Forwards",
		"Proxy-Authorization", "Proxy-Connection", "Range", "Set-Cookie", "Te", "Trailer", "Transfer-Encoding",
		"Upgrade", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Idempotency-Key",
		"Traceparent", "Tracestate", "Baggage", // read and set with tracing on
		RequestIDHeader,
	}, own...) {
		deny[http.CanonicalHeaderKey(k)] = true
	}
	return deny
}
