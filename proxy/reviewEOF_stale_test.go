package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// reviewEOFOutliveTransport: call 1 (a POST) is answered before its body
// is read, and its body is read once later, after the handler returned, as
// net/http's Transport write loop does when the upstream answers mid-upload
// (ReverseProxy: "the RoundTrip goroutine that reads the Body can outlive
// this handler"). Call 2 (a GET on the same client connection) answers
// after `slow`.
type reviewEOFOutliveTransport struct {
	calls    *atomic.Int64
	lateRead chan struct{} // closed by the test when call 1 is over
	lateErr  chan error
	slow     time.Duration
}

func (o reviewEOFOutliveTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if o.calls.Add(1) == 1 {
		body := r.Body
		go func() {
			select {
			case <-o.lateRead:
			case <-time.After(5 * time.Second):
			}
			_, err := body.Read(make([]byte, 16))
			o.lateErr <- err
		}()
		return &http.Response{
			StatusCode: http.StatusUnauthorized, ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{}, Body: io.NopCloser(strings.NewReader("no")), ContentLength: 2, Request: r,
		}, nil
	}
	select {
	case <-time.After(o.slow):
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	return &http.Response{
		StatusCode: http.StatusOK, ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(strings.NewReader("slow-ok")), ContentLength: 7, Request: r,
	}, nil
}

// TestReviewEOFLateReadAfterCloseLeaksDeadline: the body of request 1 was
// closed by the server before idleBody saw io.EOF (the upstream answered
// mid-upload; net/http discarded the rest and closed the body). The
// Transport's next read of it comes after the handler returned: idleBody
// arms REQUEST_READ_TIMEOUT on the client connection, gets "read on closed
// body" (neither io.EOF nor a timeout) and leaves the deadline armed. The
// connection now serves request 2, a pass-through whose upstream takes
// longer than REQUEST_READ_TIMEOUT: net/http's background read would hit the
// stale deadline and cancel request 2. 06d58fc stops this only for a body
// that idleBody read to io.EOF; this probe PASSES because Go 1.26's
// ReverseProxy wraps the outgoing body in noopCloseReader, closed when the
// handler returns, so a read after that never reaches idleBody.
func TestReviewEOFLateReadAfterCloseLeaksDeadline(t *testing.T) {
	ot := reviewEOFOutliveTransport{calls: new(atomic.Int64), lateRead: make(chan struct{}), lateErr: make(chan error, 1), slow: 900 * time.Millisecond}
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.Transport = ot
		o.RequestReadTimeout = 300 * time.Millisecond
		o.UpstreamTimeout = 3 * time.Second
	})
	c := dialProxy(t, e)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	body := "0123456789abcdef"
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	r1, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(r1.Body)
	if r1.Close {
		t.Skip("the server closes the connection after request 1; nothing to leak into")
	}
	time.Sleep(50 * time.Millisecond) // the handler has returned
	close(ot.lateRead)
	lerr := <-ot.lateErr
	t.Logf("late read of request 1's body: %v", lerr)

	start := time.Now()
	fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	r2, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("request 2: no answer after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	b, err := io.ReadAll(r2.Body)
	if r2.StatusCode != http.StatusOK || string(b) != "slow-ok" || err != nil {
		t.Fatalf("REQUEST 2 CUT after %v: status %d body %q err %v; want the upstream's 200 (request 1's late body read left REQUEST_READ_TIMEOUT armed on the connection)", time.Since(start).Round(time.Millisecond), r2.StatusCode, b, err)
	}
}
