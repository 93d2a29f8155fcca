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

// reviewEOFLateTransport answers its first `plain` calls at once (201, body
// read whole), and every later call as lateCheckTransport does: the answer
// is handed back after Content-Length bytes, and the Transport's extra read
// (transfer.go writeBody, nextra) happens only once the client has the
// answer's headers; an error there cuts the answer, as the Transport does.
type reviewEOFLateTransport struct {
	plain            int64
	calls            *atomic.Int64
	clientHasHeaders chan struct{}
	checkErr         chan error
}

func (l reviewEOFLateTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if l.calls.Add(1) <= l.plain {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		return &http.Response{
			StatusCode: http.StatusCreated, ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {"application/json"}},
			Body:          io.NopCloser(strings.NewReader(fmt.Sprintf(`{"len":%d}`, len(b)))),
			ContentLength: -1,
			Request:       r,
		}, nil
	}
	return lateCheckTransport{clientHasHeaders: l.clientHasHeaders, checkErr: l.checkErr}.RoundTrip(r)
}

// TestReviewEOFObserveDuplicateLateRead: in observe mode a duplicate (same
// key, same body) is forwarded with the body readBody consumed in memory
// put back in front of the server's body (unreadBody: MultiReader(prefix,
// r.Body)). The server's body was read to its end by readBody, so when the
// proxy flushes the answer's headers net/http discards nothing and closes
// it. The Transport's check read after Content-Length bytes goes through
// idleBody (ended is false: the in-memory prefix never returned io.EOF to
// idleBody) into the MultiReader, which moves past the prefix to the closed
// server body: "http: invalid Read on closed Body", and the Transport drops
// the connection the streamed answer comes on. The fix of 06d58fc covers a
// body read through idleBody to its end, not this one.
func TestReviewEOFObserveDuplicateLateRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
	}{
		{"would_replay", `{"event":"ping"}`},
		{"would_mismatch", `{"event":"pong"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lt := reviewEOFLateTransport{plain: 1, calls: new(atomic.Int64), clientHasHeaders: make(chan struct{}), checkErr: make(chan error, 1)}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				observe(o)
				o.Transport = lt
			})
			first := e.do(req{key: "dup-1", body: `{"event":"ping"}`})
			if first.StatusCode != http.StatusCreated {
				t.Fatalf("first: status %d %s", first.StatusCode, first.body)
			}

			c := dialProxy(t, e)
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: dup-1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(tc.body), tc.body)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			close(lt.clientHasHeaders)
			got, err := io.ReadAll(resp.Body)
			var cerr error
			select {
			case cerr = <-lt.checkErr:
			case <-time.After(5 * time.Second):
				t.Fatal("the check read never happened")
			}
			if cerr != nil {
				t.Errorf("the Transport's read after the body's end got %v, want io.EOF", cerr)
			}
			if err != nil || !strings.Contains(string(got), "data: done") {
				t.Fatalf("ANSWER CUT: status %d, body %q, err %v; want the upstream's whole stream", resp.StatusCode, got, err)
			}
		})
	}
}

// reviewEOFHoldCheck wraps a request body as a loaded machine orders it:
// once the Transport has had Content-Length bytes, its next read (the check
// read of transfer.go writeBody) waits until the client has the answer's
// headers, then goes to the real body.
type reviewEOFHoldCheck struct {
	io.ReadCloser
	left      int64
	hold      <-chan struct{}
	checkErr  chan<- error
	checkDone chan struct{}
}

func (b *reviewEOFHoldCheck) Read(p []byte) (int, error) {
	if b.left > 0 {
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err := b.ReadCloser.Read(p)
		b.left -= int64(n)
		return n, err
	}
	select {
	case <-b.hold:
	case <-time.After(5 * time.Second):
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.checkErr <- nil
	} else {
		b.checkErr <- fmt.Errorf("check read: n=%d err=%v", n, err)
	}
	close(b.checkDone)
	return n, err
}

type reviewEOFHoldTransport struct {
	rt        http.RoundTripper
	late      func(r *http.Request) bool
	hold      chan struct{}
	checkErr  chan error
	checkDone chan struct{}
}

func (h reviewEOFHoldTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.late(r) && r.Body != nil && r.ContentLength > 0 {
		r = r.Clone(r.Context())
		r.Body = &reviewEOFHoldCheck{ReadCloser: r.Body, left: r.ContentLength, hold: h.hold, checkErr: h.checkErr, checkDone: h.checkDone}
	}
	return h.rt.RoundTrip(r)
}

// TestReviewEOFRealTransportLateCheck: the same order with net/http's own
// Transport and a real upstream that streams its answer. pass-through is the
// case 06d58fc fixed (it passes); observe-duplicate is the in-memory prefix
// of unreadBody (it fails: the Transport drops the upstream connection and
// the client's stream is cut).
func TestReviewEOFRealTransportLateCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		observe bool
		key     string
	}{
		{"pass-through", false, ""},
		{"observe-duplicate", true, "dup-2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			ht := reviewEOFHoldTransport{
				rt:        proxy.NewTransport(),
				late:      func(*http.Request) bool { return calls.Add(1) == 2 || !tc.observe },
				hold:      make(chan struct{}),
				checkErr:  make(chan error, 1),
				checkDone: make(chan struct{}),
			}
			e := newEnv(t, miniBackend, func(o *proxy.Options) {
				o.Default.Observe = tc.observe
				o.Transport = ht
			})
			var n atomic.Int64
			e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if n.Add(1) == 1 && tc.observe {
					w.WriteHeader(http.StatusCreated)
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				select {
				case <-ht.checkDone:
				case <-time.After(5 * time.Second):
				}
				time.Sleep(100 * time.Millisecond)
				_, _ = io.WriteString(w, "data: done\n\n")
			})
			body := `{"event":"ping"}`
			if tc.observe {
				if r := e.do(req{key: tc.key, body: body}); r.StatusCode != http.StatusCreated {
					t.Fatalf("first: %d %s", r.StatusCode, r.body)
				}
			}
			c := dialProxy(t, e)
			defer c.Close()
			head := "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
			if tc.key != "" {
				head += "Idempotency-Key: " + tc.key + "\r\n"
			}
			fmt.Fprintf(c, "%sContent-Length: %d\r\n\r\n%s", head, len(body), body)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			close(ht.hold)
			got, err := io.ReadAll(resp.Body)
			select {
			case cerr := <-ht.checkErr:
				if cerr != nil {
					t.Errorf("%v, want io.EOF", cerr)
				}
			case <-time.After(5 * time.Second):
				t.Error("no check read")
			}
			if err != nil || !strings.Contains(string(got), "data: done") {
				t.Fatalf("ANSWER CUT: status %d, body %q, err %v; want the upstream's whole stream", resp.StatusCode, got, err)
			}
		})
	}
}
