package proxy_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestReview84LongRefusalWithUnsentBodyIsBounded (review 84): review 83
// bounds the read net/http makes of an unread body by a read deadline set
// in Handler.finish, after the handler returns. But net/http reads that
// body when the answer's header is written, which for an answer over its
// 2 KiB response buffer is inside the handler's own Write (writeProblem),
// before finish runs and with no read deadline. Refusals that quote what
// the client sent are such answers: a refused Upgrade (its protocols), a
// key=query:NAME whose value does not decode (the value). A client that
// declares a body, sends a long value and never sends the body holds the
// handler for ever and never gets its answer.
func TestReview84LongRefusalWithUnsentBodyIsBounded(t *testing.T) {
	const readTimeout = time.Second
	e := newEnv(t, miniBackend, func(o *proxy.Options) {
		o.RequestReadTimeout = readTimeout
		o.Routes, _ = proxy.ParseRoutes("POST /hooks/q key=query:id scope=")
	})
	long := strings.Repeat("a", 3000)
	cases := []struct{ name, head string }{
		{"refused upgrade, long protocol list",
			"POST /v1/orders HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket" + long + "\r\nContent-Length: 100\r\n\r\n"},
		{"key=query:id that does not decode, long",
			"POST /hooks/q?id=%zz" + long + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"},
		{"refused upgrade, short (control: bounded since review 83)",
			"POST /v1/orders HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\nContent-Length: 100\r\n\r\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { expectAnswerWithoutBody(t, e, c.head, http.StatusBadRequest, readTimeout) })
	}
}
