// Package chaos runs idemproxy (the real binary, several replicas sharing one
// Redis) under faults on a seeded schedule, while clients retry keyed POSTs
// the way SDKs do, and checks what happened against what the proxy promises.
//
// A run produces a History: every client attempt (Op), every execution the
// upstream saw (Execution, its ledger), every line the proxies logged and
// what their /metrics said before each of them stopped. Check reads a
// History and reports, per run, the executions beyond the first of each key
// (announced by the proxy, or silent), the replays that are not an answer
// the upstream gave for that key, and the client requests left without an
// answer. docs/reliability.md explains the verdicts and holds the latest
// matrix; `make chaos` reproduces it.
//
// Nothing here runs in the normal test suite except the checker's unit
// tests, a check that the broken-build mutation still applies, and a small
// smoke run of the harness. The matrix runs behind -chaos.matrix.
package chaos

import "time"

// Op is one HTTP attempt of a client: one request, one answer or error.
type Op struct {
	Key    string `json:"key"`
	Auth   string `json:"auth"`   // the Authorization sent: the key's scope
	Sender int    `json:"sender"` // the logical request's sender that made it
	Proxy  int    `json:"proxy"`  // proxy slot it was sent to
	// Start and End are offsets from the run's start; End is zero for an op
	// that never returned (reported as unanswered).
	Start time.Duration `json:"start"`
	End   time.Duration `json:"end"`
	// Result: "answer" (a status and a whole body), "timeout" (the client's
	// deadline), "transport" (reset, EOF, refused, or a body cut off), or
	// "" while it has not returned.
	Result   string `json:"result"`
	Status   int    `json:"status,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	// Problem is the type of an application/problem+json answer.
	Problem   string `json:"problem,omitempty"`
	Body      string `json:"body,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	Err       string `json:"err,omitempty"`

	retryAfter string // the answer's Retry-After, for the client's wait
}

// Definitive reports whether a client stops retrying after op: an answer
// that is the request's outcome (2xx, 4xx but 409; a replay of an answer
// not stored; an outcome-unknown under ON_UNKNOWN=hold). Timeouts,
// transport errors, 409 and other 5xx are retried.
func (op Op) Definitive() bool {
	if op.Result != "answer" {
		return false
	}
	switch {
	case op.Problem == problemUnknown:
		return true
	case op.Status == 409:
		return false
	case op.Status >= 500:
		return false
	}
	return true
}

// Execution is one call the upstream received: its ledger entry.
type Execution struct {
	ID   string `json:"id"` // unique per execution, in its answer's body and X-Exec header
	Key  string `json:"key"`
	Auth string `json:"auth"`
	// Request is the body the upstream received.
	Request string        `json:"request"`
	Proxy   int           `json:"proxy"` // the slot whose upstream link it came through
	Start   time.Duration `json:"start"`
	End     time.Duration `json:"end"` // zero if the handler never finished
	// Status and Body are the answer it gave; Headers those it set.
	Status  int               `json:"status"`
	Body    string            `json:"body"`
	Headers map[string]string `json:"headers,omitempty"`
}

// LogLine is one JSON line a proxy wrote on its standard output, with the
// fields the checker reads.
type LogLine struct {
	Proxy       int           `json:"proxy"`
	Incarnation int           `json:"inc"` // index into History.Incarnations
	At          time.Duration `json:"at"`  // when the harness read it
	Level       string        `json:"level"`
	Message     string        `json:"message"`
	RequestID   string        `json:"request_id,omitempty"`
	KeyHash     string        `json:"key_hash,omitempty"`
	Outcome     string        `json:"outcome,omitempty"`
	Status      int           `json:"status,omitempty"`
}

// Incarnation is one process of a proxy slot, from its start to its stop.
type Incarnation struct {
	Proxy int           `json:"proxy"`
	Pid   int           `json:"pid"`
	Start time.Duration `json:"start"`
	End   time.Duration `json:"end"`
	// How it ended: "kill" (SIGKILL), "term" (SIGTERM at the end of the run).
	Ended string `json:"ended"`
	// Metrics scraped from /metrics just before it was stopped (nil when
	// the scrape failed): idemproxy_requests_total summed by outcome as
	// "requests/<outcome>", and the counters double_executions and
	// record_failures.
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// Fault is one fault injected, for the report.
type Fault struct {
	At     time.Duration `json:"at"`
	Kind   string        `json:"kind"`
	Target string        `json:"target"`
	For    time.Duration `json:"for,omitempty"`
}

// KeyInfo is one idempotency key the clients used.
type KeyInfo struct {
	Key  string `json:"key"`
	Auth string `json:"auth"` // the Authorization value: the scope (SCOPE_HEADERS=Authorization)
	Body string `json:"body"`
	Hash string `json:"hash"` // key_hash, as the proxy logs it
}

// Sender is one client's retry loop for one logical request: its ops, in
// order, and whether it ended with a definitive answer.
type Sender struct {
	ID       int    `json:"id"`
	Key      string `json:"key"`
	Auth     string `json:"auth"`
	Resolved bool   `json:"resolved"`
}

// History is everything one run recorded.
type History struct {
	Row       string        `json:"row"`
	Seed      uint64        `json:"seed"`
	OnUnknown string        `json:"on_unknown"` // expire or hold
	Keys      []KeyInfo     `json:"keys"`
	Senders   []Sender      `json:"senders"`
	Ops       []Op          `json:"ops"`
	Execs     []Execution   `json:"execs"`
	Logs      []LogLine     `json:"logs"`
	Incs      []Incarnation `json:"incarnations"`
	Faults    []Fault       `json:"faults"`
}

// Problem types the checker recognises (docs/behaviour.md).
const (
	problemUnknown   = "urn:idemproxy:problem:outcome-unknown"
	problemNotStored = "urn:idemproxy:problem:response-not-stored"
	problemReused    = "urn:idemproxy:problem:key-reused"
)
