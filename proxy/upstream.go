package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
)

// answerBody is an upstream answer's body, remembering why it ended before
// its end: ReverseProxy logs that itself, through one log.Logger for every
// request, so its line cannot name the request (reverseProxyLog drops it,
// and the request's own warning says it instead). It lives in the
// request's exchange or watchdog: no allocation of its own.
type answerBody struct {
	io.ReadCloser
	err   error // the first read error but io.EOF and context.Canceled (the client left)
	ended bool  // read to its end
}

func (b *answerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		b.ended = true
	case err != nil && b.err == nil && !errors.Is(err, context.Canceled):
		b.err = err
	}
	return n, err
}

// wrap puts b in front of res's body; not a protocol switch's, which
// ReverseProxy uses as the connection (io.ReadWriteCloser).
func (b *answerBody) wrap(res *http.Response) {
	if res.StatusCode != http.StatusSwitchingProtocols && res.Body != nil {
		b.ReadCloser = res.Body
		res.Body = b
	}
}

// reverseProxyLog is ReverseProxy's ErrorLog: its lines go to the Logger,
// but for "read error during body copy", which the request's own warning
// reports with its request_id (answerBody).
type reverseProxyLog struct{ w io.Writer }

func (l reverseProxyLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("ReverseProxy read error during body copy")) {
		return len(p), nil
	}
	return l.w.Write(p)
}
