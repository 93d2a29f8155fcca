package proxy

import (
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"
)

// NewTransport returns the upstream transport. The defaults of
// http.DefaultTransport keep two idle connections per host, so under
// concurrency most requests would dial a fresh TCP connection; a proxy talks to
// one host and wants a large idle pool. HTTP/2 is not attempted: upstreams are
// plain-HTTP legacy APIs and the upgrade probing costs on every new connection.
// The bare reference proxy of the benchmark uses this same function, so the
// comparison measures idempotency and nothing else.
func NewTransport() *http.Transport {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 nil, // an edge proxy must not follow HTTP_PROXY of its host
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     false,
		MaxIdleConns:          2048,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// The upstream's encoding is passed through and recorded as sent.
		DisableCompression: true,
		WriteBufferSize:    32 << 10,
		ReadBufferSize:     32 << 10,
	}
}

// bufferPool implements httputil.BufferPool with 32 KiB copy buffers, so
// ReverseProxy does not allocate one per response.
type bufferPool struct{ p sync.Pool }

// NewBufferPool returns the copy-buffer pool given to httputil.ReverseProxy.
func NewBufferPool() httputil.BufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
}

func (b *bufferPool) Get() []byte  { return *(b.p.Get().(*[]byte)) }
func (b *bufferPool) Put(v []byte) { b.p.Put(&v) }
