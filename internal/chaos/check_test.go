package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Hand-written histories, each with a known violation (or none), so that
// the checker's verdicts can be trusted on the generated ones.

const ms = time.Millisecond

func key(k string) KeyInfo { return KeyInfo{Key: k, Hash: "hash-" + k} }

func ex(id, k string, proxy int, start time.Duration, status int) Execution {
	return Execution{ID: id, Key: k, Proxy: proxy, Start: start, End: start + 10*ms, Status: status, Body: body(k, id, status)}
}

func body(k, id string, status int) string {
	return fmt.Sprintf(`{"key":%q,"exec":%q,"status":%d}`+"\n", k, id, status)
}

// answer is an op that got e's answer, fresh or replayed.
func answer(sender int, e Execution, replayed bool, start time.Duration) Op {
	return Op{Key: e.Key, Sender: sender, Start: start, End: start + 5*ms, Result: "answer", Status: e.Status, Replayed: replayed, Body: e.Body}
}

func access(inc int, req, k, outcome string, status int) LogLine {
	return LogLine{Incarnation: inc, Level: "info", Message: "request", RequestID: req, KeyHash: "hash-" + k, Outcome: outcome, Status: status}
}

func hist(onUnknown string) *History {
	return &History{Row: "test", OnUnknown: onUnknown, Incs: []Incarnation{{Proxy: 0, Ended: "term"}, {Proxy: 1, Ended: "term"}}}
}

func resolved(h *History, ids ...int) {
	for _, id := range ids {
		h.Senders = append(h.Senders, Sender{ID: id, Key: "k", Resolved: true})
	}
}

func wantFindings(t *testing.T, r Report, kinds ...string) {
	t.Helper()
	var got []string
	for _, f := range r.Findings {
		got = append(got, f.Kind)
	}
	if strings.Join(got, ",") != strings.Join(kinds, ",") {
		t.Errorf("findings %v, want %v\n%v", got, kinds, r.Findings)
	}
}

func TestCheckCleanHistory(t *testing.T) {
	h := hist("expire")
	h.Keys = []KeyInfo{key("k")}
	e := ex("x1", "k", 0, 100*ms, 201)
	h.Execs = []Execution{e, ex("x2", "k", 1, 300*ms, 503)} // a 5xx, released: allowed to repeat
	h.Ops = []Op{
		{Key: "k", Sender: 1, Start: 50 * ms, End: 80 * ms, Result: "answer", Status: 409, Problem: "urn:idemproxy:problem:request-outstanding", Body: "{}"},
		answer(1, e, false, 90*ms),
		answer(2, e, true, 400*ms),
		{Key: "k", Sender: 2, Start: 10 * ms, End: 2000 * ms, Result: "timeout"},
	}
	h.Logs = []LogLine{access(0, "r1", "k", "executed", 201), access(1, "r2", "k", "released", 503)}
	resolved(h, 1, 2)
	r := Check(h)
	if r.Effective != 1 || r.Announced+r.Silent+r.Wrong+r.Unanswered+r.Changed != 0 {
		t.Errorf("clean history: %+v", r)
	}
	wantFindings(t, r)
}

func TestCheckSilentDuplicate(t *testing.T) {
	h := hist("expire")
	h.Keys = []KeyInfo{key("k")}
	h.Execs = []Execution{ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 300*ms, 201)}
	h.Logs = []LogLine{access(0, "r1", "k", "executed", 201)}
	r := Check(h)
	if r.Silent != 1 || r.Announced != 0 {
		t.Errorf("two executions, no signal: silent %d announced %d, want 1 0", r.Silent, r.Announced)
	}
	wantFindings(t, r, "duplicate-SILENT")
}

func TestCheckAnnouncedDuplicates(t *testing.T) {
	for _, tt := range []struct {
		name string
		line LogLine
	}{
		{"takeover", access(1, "r2", "k", "takeover", 201)},
		{"lost", access(0, "r1", "k", "lost", 201)},
		{"lost error line", LogLine{Incarnation: 0, Level: "error", RequestID: "r1", KeyHash: "hash-k",
			Message: "claim expired and was taken over before completion: this key executed twice; answer not recorded"}},
		{"record failure", access(0, "r1", "k", "store_error", 201)},
		{"record failure error line", LogLine{Incarnation: 0, Level: "error", RequestID: "r1", KeyHash: "hash-k",
			Message: "answer returned but not recorded; the key stays in flight until its lock TTL"}},
		{"not replicated", LogLine{Incarnation: 0, Level: "warn", RequestID: "r1", KeyHash: "hash-k",
			Message: "answer recorded but not yet acknowledged by REDIS_WAIT_REPLICAS replicas"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := hist("expire")
			h.Keys = []KeyInfo{key("k")}
			h.Execs = []Execution{ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 300*ms, 201)}
			h.Logs = []LogLine{tt.line}
			r := Check(h)
			if r.Announced != 1 || r.Silent != 0 || r.HoldSecond != 0 {
				t.Errorf("announced %d silent %d hold %d, want 1 0 0", r.Announced, r.Silent, r.HoldSecond)
			}
		})
	}
}

// A claim refused with 503 (store_error before anything ran) announces
// nothing about a second execution.
func TestCheckClaimRefusedIsNoSignal(t *testing.T) {
	h := hist("expire")
	h.Keys = []KeyInfo{key("k")}
	h.Execs = []Execution{ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 300*ms, 201)}
	h.Logs = []LogLine{access(0, "r0", "k", "store_error", 503)}
	if r := Check(h); r.Silent != 1 {
		t.Errorf("silent %d, want 1", r.Silent)
	}
}

// One signal for two extra executions announces only one of them.
func TestCheckSignalsCountPerExecution(t *testing.T) {
	h := hist("expire")
	h.Keys = []KeyInfo{key("k")}
	h.Execs = []Execution{ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 300*ms, 201), ex("x3", "k", 0, 500*ms, 201)}
	h.Logs = []LogLine{access(1, "r2", "k", "takeover", 201)}
	if r := Check(h); r.Announced != 1 || r.Silent != 1 {
		t.Errorf("announced %d silent %d, want 1 1", r.Announced, r.Silent)
	}
}

// The paused-lease case with the completion fence removed: the taker-over
// announced a takeover, but the paused proxy's late completion succeeded
// (outcome executed) where it should have been fenced off (lost). Two
// requests each claim the recorded answer: the duplicate is silent.
func TestCheckTwiceRecordedIsSilent(t *testing.T) {
	h := hist("expire")
	h.Keys = []KeyInfo{key("k")}
	h.Execs = []Execution{ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 3300*ms, 201)}
	h.Logs = []LogLine{access(1, "r2", "k", "takeover", 201), access(0, "r1", "k", "executed", 201)}
	r := Check(h)
	if r.Silent != 1 || r.Announced != 0 || r.TwiceRecorded != 1 || r.UnannouncedTakeover != 0 {
		t.Errorf("silent %d announced %d twice-recorded %d unannounced takeover %d, want 1 0 1 0", r.Silent, r.Announced, r.TwiceRecorded, r.UnannouncedTakeover)
	}
	// The same with the fence in place: lost, announced.
	h.Logs = []LogLine{access(1, "r2", "k", "takeover", 201), access(0, "r1", "k", "lost", 201)}
	if r := Check(h); r.Silent != 0 || r.Announced != 1 {
		t.Errorf("fenced: silent %d announced %d, want 0 1", r.Silent, r.Announced)
	}
	// An answer that broke off mid-body and was recorded without it also
	// says it recorded.
	h.Logs = []LogLine{access(1, "r2", "k", "takeover", 201), access(0, "r1", "k", "upstream_error", 201),
		{Incarnation: 0, Level: "warn", RequestID: "r1", KeyHash: "hash-k", Message: "upstream answer broke off mid-body; recorded without its body"}}
	if r := Check(h); r.Silent != 1 {
		t.Errorf("broke off and recorded: silent %d, want 1", r.Silent)
	}
}

// The shape of a takeover without its announcement: the taker-over's forward was answered 5xx and
// released (or failed), so no takeover line; the next request executed
// afresh.
func TestCheckUnannouncedTakeoverShape(t *testing.T) {
	h := hist("expire")
	h.Keys = []KeyInfo{key("k")}
	h.Execs = []Execution{ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 3300*ms, 503), ex("x3", "k", 1, 4500*ms, 201)}
	h.Logs = []LogLine{access(1, "r2", "k", "released", 503), access(1, "r3", "k", "executed", 201)}
	r := Check(h)
	if r.Silent != 1 || r.UnannouncedTakeover != 1 || r.TwiceRecorded != 0 {
		t.Errorf("silent %d unannounced takeover %d twice-recorded %d, want 1 1 0", r.Silent, r.UnannouncedTakeover, r.TwiceRecorded)
	}
}

func TestCheckHoldAnySecondExecution(t *testing.T) {
	h := hist("hold")
	h.Keys = []KeyInfo{key("k")}
	h.Execs = []Execution{ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 300*ms, 201)}
	h.Logs = []LogLine{access(1, "r2", "k", "takeover", 201)}
	r := Check(h)
	if r.HoldSecond != 1 || r.Announced != 1 {
		t.Errorf("hold: second %d announced %d, want 1 1", r.HoldSecond, r.Announced)
	}
	wantFindings(t, r, "duplicate-announced", "hold-second-execution")
}

// A takeover whose line was still in the log buffer of a proxy killed
// right after (or never written: killed mid-forward): its last /metrics
// scrape counted it. It covers an execution through that incarnation
// that left no line for its key, only.
func TestCheckAnnouncedByMetricsOfKilledProxy(t *testing.T) {
	h := hist("expire")
	h.Incs = []Incarnation{
		{Proxy: 0, Start: 0, End: 5000 * ms, Ended: "term"},
		{Proxy: 1, Start: 0, End: 1000 * ms, Ended: "kill", Metrics: map[string]float64{"takeovers": 1}},
		{Proxy: 1, Start: 1500 * ms, End: 5000 * ms, Ended: "term"},
	}
	h.Keys = []KeyInfo{key("k"), key("j")}
	h.Execs = []Execution{
		ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 300*ms, 201), // through the killed one
		ex("y1", "j", 0, 100*ms, 201), ex("y2", "j", 1, 2000*ms, 201), // through the next one
	}
	r := Check(h)
	if r.Announced != 1 || r.ByMetrics != 1 || r.Silent != 1 {
		t.Errorf("announced %d (by metrics %d) silent %d, want 1 (1) 1\n%v", r.Announced, r.ByMetrics, r.Silent, r.Findings)
	}
	// Once the line was read, the scrape explains nothing more.
	h.Logs = []LogLine{access(1, "r9", "z", "takeover", 201)}
	if r := Check(h); r.ByMetrics != 0 || r.Silent != 2 {
		t.Errorf("line read: by metrics %d silent %d, want 0 2", r.ByMetrics, r.Silent)
	}
}

func TestCheckWrongAnswers(t *testing.T) {
	e := ex("x1", "k", 0, 100*ms, 201)
	other := ex("y1", "j", 0, 100*ms, 201)
	e5 := ex("x0", "k", 0, 50*ms, 503)
	for _, tt := range []struct {
		name      string
		onUnknown string
		op        Op
		wrong     bool
	}{
		{"replay as executed", "expire", answer(1, e, true, time.Second), false},
		{"replay body differs", "expire", func() Op { o := answer(1, e, true, time.Second); o.Body = body("k", "x1", 200); return o }(), true},
		{"replay status differs", "expire", func() Op { o := answer(1, e, true, time.Second); o.Status = 200; return o }(), true},
		{"answer of another key", "expire", func() Op { o := answer(1, other, true, time.Second); o.Key = "k"; return o }(), true},
		{"execution never run", "expire", func() Op { o := answer(1, e, true, time.Second); o.Body = body("k", "x9", 201); return o }(), true},
		{"not an upstream answer", "expire", Op{Key: "k", Result: "answer", Status: 200, Body: "hello", End: 1}, true},
		{"5xx replayed", "expire", answer(1, e5, true, time.Second), true},
		{"5xx fresh", "expire", answer(1, e5, false, time.Second), false},
		{"422", "expire", Op{Key: "k", Result: "answer", Status: 422, Problem: problemReused, End: 1}, true},
		{"unknown under expire", "expire", Op{Key: "k", Result: "answer", Status: 504, Problem: problemUnknown, Replayed: true, End: 1}, true},
		{"unknown under hold", "hold", Op{Key: "k", Result: "answer", Status: 504, Problem: problemUnknown, Replayed: true, End: 1}, false},
		{"not stored, status of an execution", "expire", Op{Key: "k", Result: "answer", Status: 201, Problem: problemNotStored, Replayed: true, End: 1}, false},
		{"not stored, other status", "expire", Op{Key: "k", Result: "answer", Status: 200, Problem: problemNotStored, Replayed: true, End: 1}, true},
		{"409 is no answer", "expire", Op{Key: "k", Result: "answer", Status: 409, Problem: "urn:idemproxy:problem:request-outstanding", End: 1}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := hist(tt.onUnknown)
			h.Keys = []KeyInfo{key("k"), key("j")}
			h.Execs = []Execution{e, other, e5}
			h.Ops = []Op{tt.op}
			r := Check(h)
			if (r.Wrong == 1) != tt.wrong || r.Wrong > 1 {
				t.Errorf("wrong %d, want %v: %v", r.Wrong, tt.wrong, r.Findings)
			}
		})
	}
}

func TestCheckWrongRequest(t *testing.T) {
	h := hist("expire")
	k := key("k")
	k.Body = `{"amount":1}`
	h.Keys = []KeyInfo{k}
	good, bad, stray := ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 0, 200*ms, 201), ex("y1", "j", 0, 300*ms, 201)
	good.Request = k.Body
	bad.Request = `{"amount":2}`
	h.Execs = []Execution{good, stray}
	if r := Check(h); r.Wrong != 1 {
		t.Errorf("an execution of a key no client sent: wrong %d, want 1", r.Wrong)
	}
	h.Execs = []Execution{good, bad}
	h.Logs = []LogLine{access(0, "r", "k", "takeover", 201)}
	if r := Check(h); r.Wrong != 1 {
		t.Errorf("an execution with another body: wrong %d, want 1", r.Wrong)
	}
}

// The same key string in two scopes is two keys: two executions, no
// duplicate; an answer of one given to the other is wrong.
func TestCheckScopes(t *testing.T) {
	h := hist("expire")
	a, b := KeyInfo{Key: "k", Auth: "Bearer a", Hash: "hash-a"}, KeyInfo{Key: "k", Auth: "Bearer b", Hash: "hash-b"}
	h.Keys = []KeyInfo{a, b}
	ea, eb := ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 100*ms, 201)
	ea.Auth, eb.Auth = a.Auth, b.Auth
	h.Execs = []Execution{ea, eb}
	opA, opB := answer(1, ea, true, time.Second), answer(2, eb, true, time.Second)
	opA.Auth, opB.Auth = a.Auth, b.Auth
	h.Ops = []Op{opA, opB}
	if r := Check(h); r.Announced+r.Silent+r.Wrong != 0 {
		t.Errorf("two scopes: %+v", r)
	}
	opB.Body = ea.Body // scope b gets scope a's answer
	h.Ops = []Op{opA, opB}
	if r := Check(h); r.Wrong != 1 {
		t.Errorf("another scope's answer: wrong %d, want 1: %v", r.Wrong, r.Findings)
	}
}

func TestCheckReplayChanged(t *testing.T) {
	h := hist("expire")
	h.Keys = []KeyInfo{key("k")}
	e1, e2 := ex("x1", "k", 0, 100*ms, 201), ex("x2", "k", 1, 3000*ms, 201)
	h.Execs = []Execution{e1, e2}
	h.Ops = []Op{answer(1, e1, true, time.Second), answer(2, e2, true, 4*time.Second)}
	h.Logs = []LogLine{access(1, "r2", "k", "takeover", 201)}
	r := Check(h)
	if r.Changed != 1 || r.Wrong != 0 {
		t.Errorf("changed %d wrong %d, want 1 0", r.Changed, r.Wrong)
	}
}

func TestCheckUnanswered(t *testing.T) {
	h := hist("hold")
	h.Keys = []KeyInfo{key("k")}
	h.Ops = []Op{
		{Key: "k", Sender: 1, Start: 10 * ms}, // never returned
		{Key: "k", Sender: 2, Start: 10 * ms, End: 20 * ms, Result: "answer", Status: 409, Problem: "x"}, // gave up on 409s
		{Key: "k", Sender: 3, Start: 10 * ms, End: 20 * ms, Result: "answer", Status: 504, Problem: problemUnknown, Replayed: true},
	}
	h.Senders = []Sender{{ID: 1, Key: "k", Resolved: true}, {ID: 2, Key: "k"}, {ID: 3, Key: "k", Resolved: true}}
	r := Check(h)
	if r.Unanswered != 2 || r.Held != 1 {
		t.Errorf("unanswered %d held %d, want 2 1: %v", r.Unanswered, r.Held, r.Findings)
	}
}

func TestOpDefinitive(t *testing.T) {
	for _, tt := range []struct {
		op   Op
		want bool
	}{
		{Op{Result: "answer", Status: 201}, true},
		{Op{Result: "answer", Status: 402}, true},
		{Op{Result: "answer", Status: 409}, false},
		{Op{Result: "answer", Status: 503}, false},
		{Op{Result: "answer", Status: 504}, false},
		{Op{Result: "answer", Status: 504, Problem: problemUnknown}, true},
		{Op{Result: "timeout"}, false},
		{Op{Result: "transport", Status: 201}, false},
	} {
		if got := tt.op.Definitive(); got != tt.want {
			t.Errorf("%+v: Definitive %v, want %v", tt.op, got, tt.want)
		}
	}
}
