package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// lateCheckTransport answers as net/http's Transport does when the upstream
// replies the moment it has the request body: the answer is handed back
// before the Transport's write loop makes its last read of the request body
// (transfer.go writeBody: after Content-Length bytes, one more read to
// check that there is no more). That read comes here only once the client
// has the answer's headers, the order a loaded machine can produce; its
// error, as in the Transport, breaks the connection the answer comes on.
type lateCheckTransport struct {
	clientHasHeaders chan struct{}
	checkErr         chan error
}

func (l lateCheckTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, r.ContentLength)); err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		select {
		case <-l.clientHasHeaders:
		case <-time.After(5 * time.Second):
			pw.CloseWithError(fmt.Errorf("test: the client never got the answer's headers"))
			return
		}
		n, err := r.Body.Read(make([]byte, 1))
		if err == io.EOF && n == 0 {
			err = nil
		} else if err == nil {
			err = fmt.Errorf("read %d bytes past the body's length", n)
		}
		l.checkErr <- err
		if err != nil {
			pw.CloseWithError(err) // the Transport closes the connection
			return
		}
		_, _ = io.WriteString(pw, "data: done\n\n")
		_ = pw.Close()
	}()
	return &http.Response{
		StatusCode: http.StatusOK, ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"text/event-stream"}},
		Body:          pr,
		ContentLength: -1,
		Request:       r,
	}, nil
}

// TestPassthroughBodyReadAfterAnswer: a pass-through POST whose upstream
// answers a stream as soon as it has the body. net/http's server, when the
// proxy flushes the answer's headers, discards what is left of the request
// body and closes it; the Transport's check read that comes after that must
// still see the end of the body (it was all read), not "read on closed
// body", which would make the Transport drop the connection and cut the
// answer (seen under load in TestSlowUploadThenStreamedAnswer).
func TestPassthroughBodyReadAfterAnswer(t *testing.T) {
	lt := lateCheckTransport{clientHasHeaders: make(chan struct{}), checkErr: make(chan error, 1)}
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Transport = lt })
	c := dialProxy(t, e)
	defer c.Close()
	body := `{"event":"ping"}`
	fmt.Fprintf(c, "POST /hook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	close(lt.clientHasHeaders)
	got, err := io.ReadAll(resp.Body)
	if cerr := <-lt.checkErr; cerr != nil {
		t.Errorf("the Transport's read after the body's end got %v, want io.EOF", cerr)
	}
	if err != nil || !strings.Contains(string(got), "data: done") {
		t.Fatalf("ANSWER CUT: status %d, body %q, err %v; want the upstream's whole stream", resp.StatusCode, got, err)
	}
}
