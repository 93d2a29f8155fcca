package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"time"
)

// NewTransport returns the upstream transport. The defaults of
// http.DefaultTransport keep two idle connections per host, so under
// concurrency most requests would dial a fresh TCP connection; a proxy talks to
// one host and wants a large idle pool. HTTP/2 is not attempted: upstreams are
// plain-HTTP legacy APIs and the upgrade probing costs on every new connection.
// The bare reference proxy of the benchmark uses this same function, so the
// comparison measures idempotency and nothing else.
//
// Every connection it dials counts the bytes written to it (countingConn):
// the keyed path lets the Transport resend a request on a new connection
// only when not one byte of it reached the socket of the connection that
// failed (see exchange.rewind).
func NewTransport() *http.Transport {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy: nil, // an edge proxy must not follow HTTP_PROXY of its host
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: c}, nil
		},
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

// countingConn is an upstream connection that counts the bytes written to
// its socket, so that the keyed path can tell a request that never left
// from one that may have (exchange.rewind). The count is the one signal
// that rests on the socket: httptrace's WroteHeaders and WroteRequest fire
// when the request enters the Transport's buffer, before its final flush.
//
// One per connection, not per request: a write costs two atomic adds.
// It deliberately has no NetConn and no ReadFrom: every byte for the
// upstream goes through Write (io.Copy to it takes the buffered path,
// which is what *net.TCPConn.ReadFrom does for any body but a file or a
// socket).
type countingConn struct {
	net.Conn
	// state is the bytes written so far plus one for each Write in
	// progress: it is back at a value it had before only if no Write
	// has moved a byte since, and none is under way.
	state atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.state.Add(1)
	n, err := c.Conn.Write(p)
	c.state.Add(int64(n) - 1) // a short write with an error counts its bytes
	return n, err
}

// written is the count to compare: equal values mean no byte moved
// between them (bytes only add up; a Write under way adds one).
func (c *countingConn) written() int64 { return c.state.Load() }

// CloseWrite half-closes the connection: ReverseProxy passes a client's
// half-close on to the upstream of a protocol switch (101) tunnel through
// the Transport's response body, which asks the connection for CloseWrite.
func (c *countingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("CloseWrite: %w", errors.ErrUnsupported)
}

// writeCounter finds the counter of an upstream connection as the
// Transport's trace reports it (httptrace.GotConnInfo.Conn): the
// countingConn itself for an http upstream, under the *tls.Conn the
// Transport wraps it in for an https one, or under any layer that names
// the connection it wraps by NetConn (the convention of crypto/tls), and
// which must hand its writes straight through. Nil for any other
// connection (a Transport that does not dial through NewTransport's
// dialer): nothing is known of what reached its socket.
func writeCounter(c net.Conn) *countingConn {
	for range 4 { // a few layers; never loop on a NetConn that returns itself
		switch v := c.(type) {
		case *countingConn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}
