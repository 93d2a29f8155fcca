package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem type URIs. They are part of the external interface (listed in the
// README): clients may switch on them, so never change one.
const (
	typeKeyMissing          = "urn:idemproxy:problem:key-missing"
	typeKeyInvalid          = "urn:idemproxy:problem:key-invalid"
	typeBodyTooLarge        = "urn:idemproxy:problem:body-too-large"
	typeBodyUnreadable      = "urn:idemproxy:problem:body-unreadable"
	typeKeyReused           = "urn:idemproxy:problem:key-reused"
	typeRequestOutstanding  = "urn:idemproxy:problem:request-outstanding"
	typeStoreUnavailable    = "urn:idemproxy:problem:store-unavailable"
	typeUpstreamUnreachable = "urn:idemproxy:problem:upstream-unreachable"
	typeUpstreamTimeout     = "urn:idemproxy:problem:upstream-timeout"
	typeUpstreamFailed      = "urn:idemproxy:problem:upstream-failed"
	typeResponseNotStored   = "urn:idemproxy:problem:response-not-stored"
	typeRecordUnreadable    = "urn:idemproxy:problem:record-unreadable"
	typeRequestTimeout      = "urn:idemproxy:problem:request-timeout"
	typeUpgradeRefused      = "urn:idemproxy:problem:upgrade-refused"
	typeOutcomeUnknown      = "urn:idemproxy:problem:outcome-unknown"
	typeOverloaded          = "urn:idemproxy:problem:overloaded"
	typeSignatureInvalid    = "urn:idemproxy:problem:signature-invalid"
)

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// writeProblem writes an RFC 9457 problem+json answer. Every answer the
// proxy produces itself goes through here (by answer.write).
func writeProblem(w http.ResponseWriter, status int, typ, title, detail string) {
	body, err := json.Marshal(problem{Type: typ, Title: title, Status: status, Detail: detail})
	if err != nil { // cannot happen for strings and ints
		body = []byte(`{"title":"internal error"}`)
	}
	body = append(body, '\n') // as curl users expect: the prompt on a line of its own
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body) // the client is gone if this fails; nothing to do
}
