package chaos

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Report is the checker's verdict on one History.
type Report struct {
	Row    string
	Ops    int // HTTP attempts
	Faults int // faults injected
	Keys   int // idempotency keys used
	Execs  int // executions the upstream saw, all statuses
	// Effective executions are those whose answer was not 5xx: with
	// ON_5XX=release a 5xx frees the key by design (docs/behaviour.md,
	// "When a request can execute twice", 2), so only these count.
	Effective int
	// Executions beyond the first of a key (effective ones), split by
	// whether the proxy announced them for that key_hash.
	Announced int
	Silent    int
	// TwiceRecorded is the part of Silent where two requests of one key
	// each said they recorded its answer (outcome executed or takeover): a
	// late completion that was not fenced off, or a record that Redis lost
	// (a failover without WAIT) before the key ran again.
	TwiceRecorded int
	// UnannouncedTakeover is the part of Silent of the shape of the known defect
	// (docs/reliability.md): the key's log shows a forward released (5xx)
	// or failed (upstream_error) and no takeover for a later execution — a
	// takeover whose own forward did not record loses its announcement.
	UnannouncedTakeover int
	// ByMetrics is the part of Announced known only from a killed proxy's
	// last /metrics scrape: its access-log line was still in the proxy's
	// log buffer when it was killed.
	ByMetrics int
	// HoldSecond counts, under ON_UNKNOWN=hold, every execution beyond the
	// first of a key, announced or not: hold promises none.
	HoldSecond int
	// Wrong counts executions of a request other than the key's (another
	// body or Authorization than its client sent), and answers that are
	// not an answer the upstream gave for that key: a replay (or fresh
	// answer) whose status or body differs from every execution of the
	// key, an answer of another key, a 5xx replayed, a 422 (the clients
	// never reuse a key for another request), outcome-unknown under
	// ON_UNKNOWN=expire.
	Wrong int
	// Changed counts keys whose replays came from two different
	// executions: a recorded answer was replaced (lost in a failover, or
	// overwritten).
	Changed int
	// Unanswered counts ops that never returned plus logical requests
	// (senders) that never got a definitive answer by the end of the run,
	// faults healed.
	Unanswered int
	// Held counts senders that ended with outcome-unknown (hold).
	Held int

	Findings []Finding
}

// Finding is one violation or notable event, for the log of a run.
type Finding struct {
	Kind    string
	Key     string
	KeyHash string
	Detail  string
}

func (f Finding) String() string {
	return fmt.Sprintf("%s key=%s key_hash=%s: %s", f.Kind, f.Key, short(f.KeyHash), f.Detail)
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// Signal kinds: what a proxy logs when a key may have executed twice.
const (
	sigTakeover      = "takeover"       // access log outcome=takeover: an expired claim was taken over
	sigLost          = "lost"           // outcome=lost / "taken over before completion": fenced off
	sigRecordFailure = "record_failure" // outcome=store_error with an upstream status, "not recorded"
	sigNotReplicated = "not_replicated" // recorded, WAIT not acknowledged: a failover may lose it
)

// logIndex is what the logs say about each key_hash.
type logIndex struct {
	// signals: key_hash -> request (incarnation/request_id) -> kind.
	signals map[string]map[string]string
	// recorded: key_hash -> requests that said they recorded the answer of
	// their execution (outcome executed or takeover with a status below
	// 500, or upstream_error with "recorded without its body").
	recorded map[string]map[string]bool
	// accessByInc: incarnation -> key_hash -> access lines of executing
	// outcomes.
	accessByInc map[int]map[string]int
	// seen: incarnation -> outcome -> access lines read.
	seen map[int]map[string]int
	// seenRecordFailures: incarnation -> record-failure error lines read.
	seenRecordFailures map[int]int
	// failedForward: key_hash -> a request forwarded it and was released
	// or failed (outcome released or upstream_error).
	failedForward map[string]bool
}

// executingOutcomes are the access-log outcomes of a request that was
// forwarded under its claim.
var executingOutcomes = map[string]bool{
	"executed": true, "takeover": true, "lost": true, "store_error": true,
	"upstream_error": true, "released": true,
}

func indexLogs(lines []LogLine) *logIndex {
	ix := &logIndex{
		signals:            map[string]map[string]string{},
		recorded:           map[string]map[string]bool{},
		accessByInc:        map[int]map[string]int{},
		seen:               map[int]map[string]int{},
		seenRecordFailures: map[int]int{},
		failedForward:      map[string]bool{},
	}
	brokeOffRecorded := map[string]bool{} // request -> "recorded without its body"
	signal := func(hash, req, kind string) {
		if ix.signals[hash] == nil {
			ix.signals[hash] = map[string]string{}
		}
		if _, ok := ix.signals[hash][req]; !ok {
			ix.signals[hash][req] = kind
		}
	}
	recorded := func(hash, req string) {
		if ix.recorded[hash] == nil {
			ix.recorded[hash] = map[string]bool{}
		}
		ix.recorded[hash][req] = true
	}
	for _, l := range lines {
		req := strconv.Itoa(l.Incarnation) + "/" + l.RequestID
		if l.Message == "request" { // the access log line
			if ix.seen[l.Incarnation] == nil {
				ix.seen[l.Incarnation] = map[string]int{}
			}
			ix.seen[l.Incarnation][l.Outcome]++
			if l.KeyHash == "" {
				continue
			}
			if executingOutcomes[l.Outcome] {
				if ix.accessByInc[l.Incarnation] == nil {
					ix.accessByInc[l.Incarnation] = map[string]int{}
				}
				ix.accessByInc[l.Incarnation][l.KeyHash]++
			}
			switch l.Outcome {
			case "takeover":
				signal(l.KeyHash, req, sigTakeover)
			case "lost":
				signal(l.KeyHash, req, sigLost)
			case "store_error":
				if l.Status != 503 { // 503 is a claim refused, not an answer unrecorded
					signal(l.KeyHash, req, sigRecordFailure)
				}
			}
			if l.Outcome == "released" || l.Outcome == "upstream_error" {
				ix.failedForward[l.KeyHash] = true
			}
			if (l.Outcome == "executed" || l.Outcome == "takeover") && l.Status < 500 {
				recorded(l.KeyHash, req)
			}
			continue
		}
		if l.KeyHash == "" || (l.Level != "warn" && l.Level != "error") {
			continue
		}
		m := l.Message
		switch {
		case strings.Contains(m, "took over an in-flight claim"):
			signal(l.KeyHash, req, sigTakeover)
		case strings.Contains(m, "taken over before"):
			signal(l.KeyHash, req, sigLost)
		case strings.Contains(m, "not recorded"):
			signal(l.KeyHash, req, sigRecordFailure)
			ix.seenRecordFailures[l.Incarnation]++
		case strings.Contains(m, "not yet acknowledged"):
			signal(l.KeyHash, req, sigNotReplicated)
		case strings.Contains(m, "recorded without its body"):
			brokeOffRecorded[req] = true
		}
	}
	// An answer that broke off mid-body is recorded without its body, and
	// logged upstream_error: count it as recorded unless it was lost.
	for _, l := range lines {
		req := strconv.Itoa(l.Incarnation) + "/" + l.RequestID
		if l.Message == "request" && l.Outcome == "upstream_error" && brokeOffRecorded[req] && l.KeyHash != "" {
			recorded(l.KeyHash, req)
		}
	}
	return ix
}

// deficits returns, per killed incarnation, how many takeover, lost and
// record-failure announcements its last /metrics scrape counted that no
// log line read from it shows: lines still in its log buffer when it was
// SIGKILLed (the access log is written every 100 ms), or never written
// because it was killed before its request ended.
func deficits(h *History, ix *logIndex) map[int]int {
	out := map[int]int{}
	for i, inc := range h.Incs {
		if inc.Ended != "kill" || inc.Metrics == nil {
			continue
		}
		// A takeover is counted in the histogram when it is claimed, so a
		// taker-over killed mid-forward (no access line ever) counts too.
		d := max(0, int(inc.Metrics["takeovers"])-ix.seen[i]["takeover"])
		d += max(0, int(inc.Metrics["requests/lost"])-ix.seen[i]["lost"])
		d += max(0, int(inc.Metrics["record_failures"])-ix.seenRecordFailures[i])
		if d > 0 {
			out[i] = d
		}
	}
	return out
}

// incarnationAt returns the index of the incarnation of proxy slot that
// was running at t (the last one started at or before t), or -1.
func incarnationAt(h *History, slot int, t int64) int {
	best := -1
	for i, inc := range h.Incs {
		if inc.Proxy == slot && int64(inc.Start) <= t && (best < 0 || inc.Start >= h.Incs[best].Start) {
			best = i
		}
	}
	return best
}

// upstreamAnswer is the JSON body the chaos upstream answers with.
type upstreamAnswer struct {
	Key  string `json:"key"`
	Exec string `json:"exec"`
}

// Check reads h and reports. It depends on the order of nothing but the
// executions' start times (to tell which came first), and on no timing.
func Check(h *History) Report {
	r := Report{Row: h.Row, Ops: len(h.Ops), Faults: len(h.Faults), Keys: len(h.Keys), Execs: len(h.Execs)}
	// Keys are told apart by (scope, key), as the proxy does: the same key
	// string sent with another Authorization is another key.
	hashOf, keyOf := map[string]string{}, map[string]KeyInfo{}
	for _, k := range h.Keys {
		hashOf[sid(k.Auth, k.Key)], keyOf[sid(k.Auth, k.Key)] = k.Hash, k
	}
	execsOf := map[string][]Execution{}
	execByID := map[string]Execution{}
	for _, e := range h.Execs {
		execsOf[sid(e.Auth, e.Key)] = append(execsOf[sid(e.Auth, e.Key)], e)
		execByID[e.ID] = e
	}
	for _, e := range h.Execs {
		k, ok := keyOf[sid(e.Auth, e.Key)]
		switch {
		case !ok:
			r.Wrong++
			r.Findings = append(r.Findings, Finding{"wrong-request", e.Key, "", fmt.Sprintf("execution %s of a (scope, key) no client sent", e.ID)})
		case k.Body != "" && e.Request != k.Body:
			r.Wrong++
			r.Findings = append(r.Findings, Finding{"wrong-request", e.Key, k.Hash,
				fmt.Sprintf("execution %s received another body than its key's client sent", e.ID)})
		}
	}
	ix := indexLogs(h.Logs)
	deficit := deficits(h, ix)

	keys := sortedKeys(execsOf)
	for _, id := range keys {
		all := execsOf[id]
		sort.Slice(all, func(i, j int) bool { return all[i].Start < all[j].Start })
		var eff []Execution
		for _, e := range all {
			if e.Status < 500 {
				eff = append(eff, e)
			}
		}
		r.Effective += len(eff)
		extra := len(eff) - 1
		if extra <= 0 {
			continue
		}
		hash, key := hashOf[id], all[0].Key
		signals := ix.signals[hash]
		recorded := len(ix.recorded[hash])
		unsignalled := max(0, extra-len(signals))
		// Announcements a killed proxy counted but whose lines it never
		// wrote: only for an execution through that very incarnation that
		// left no access line for this key.
		byMetrics := 0
		for _, e := range eff {
			if unsignalled-byMetrics <= 0 {
				break
			}
			inc := incarnationAt(h, e.Proxy, int64(e.Start))
			if inc < 0 || deficit[inc] == 0 || ix.accessByInc[inc][hash] > 0 {
				continue
			}
			deficit[inc]--
			byMetrics++
		}
		// Two requests that each said they recorded the key's answer: one
		// of them executed again, and told nobody (its completion should
		// have been fenced off and logged lost).
		twiceRecorded := 0
		if recorded >= 2 {
			twiceRecorded = min(extra, recorded-1)
		}
		silent := max(unsignalled-byMetrics, twiceRecorded)
		r.Silent += silent
		r.TwiceRecorded += twiceRecorded
		shape := ""
		switch {
		case twiceRecorded > 0:
			shape = "; shape: recorded twice (a late completion not fenced off, or a record Redis lost)"
		case silent > 0 && ix.failedForward[hash]:
			shape = "; shape: a takeover whose forward was released or failed, not announced"
			r.UnannouncedTakeover += silent
		}
		r.Announced += extra - silent
		r.ByMetrics += min(byMetrics, extra-silent)
		kinds := make([]string, 0, len(signals))
		for _, k := range signals {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		ids := make([]string, len(eff))
		for i, e := range eff {
			ids[i] = fmt.Sprintf("%s(p%d,%d)", e.ID, e.Proxy, e.Status)
		}
		detail := fmt.Sprintf("%d effective executions %v; signals %v; %d requests said they recorded it", len(eff), ids, kinds, recorded)
		if byMetrics > 0 {
			detail += fmt.Sprintf("; %d announced only in a killed proxy's metrics", byMetrics)
		}
		detail += shape
		kind := "duplicate-announced"
		if silent > 0 {
			kind = "duplicate-SILENT"
		}
		r.Findings = append(r.Findings, Finding{kind, key, hash, detail})
		if h.OnUnknown == "hold" {
			r.HoldSecond += extra
			r.Findings = append(r.Findings, Finding{"hold-second-execution", key, hash, detail})
		}
	}

	replayedFrom := map[string]map[string]bool{}
	for _, op := range h.Ops {
		if op.Result == "" || op.End == 0 {
			r.Unanswered++
			r.Findings = append(r.Findings, Finding{"op-unanswered", op.Key, hashOf[sid(op.Auth, op.Key)],
				fmt.Sprintf("attempt to proxy %d at %v never returned", op.Proxy, op.Start)})
			continue
		}
		if op.Result != "answer" {
			continue
		}
		if why := wrongAnswer(h, op, execsOf[sid(op.Auth, op.Key)], execByID); why != "" {
			r.Wrong++
			r.Findings = append(r.Findings, Finding{"wrong-answer", op.Key, hashOf[sid(op.Auth, op.Key)], why})
			continue
		}
		if op.Replayed && op.Problem == "" {
			var a upstreamAnswer
			if json.Unmarshal([]byte(op.Body), &a) == nil {
				id := sid(op.Auth, op.Key)
				if replayedFrom[id] == nil {
					replayedFrom[id] = map[string]bool{}
				}
				replayedFrom[id][a.Exec] = true
			}
		}
	}
	for _, key := range sortedKeys(replayedFrom) {
		if n := len(replayedFrom[key]); n > 1 {
			r.Changed++
			r.Findings = append(r.Findings, Finding{"replay-changed", unsid(key), hashOf[key],
				fmt.Sprintf("replays came from %d different executions %v", n, sortedKeys(replayedFrom[key]))})
		}
	}
	lastOp := map[int]Op{}
	for _, op := range h.Ops {
		if op.End != 0 {
			if prev, ok := lastOp[op.Sender]; !ok || op.Start >= prev.Start {
				lastOp[op.Sender] = op
			}
		}
	}
	for _, s := range h.Senders {
		if !s.Resolved {
			r.Unanswered++
			last := lastOp[s.ID]
			r.Findings = append(r.Findings, Finding{"request-unanswered", s.Key, hashOf[sid(s.Auth, s.Key)],
				fmt.Sprintf("sender %d gave up without a definitive answer; last attempt: %s %d %s", s.ID, last.Result, last.Status, last.Problem)})
			continue
		}
		if op, ok := lastOp[s.ID]; ok && op.Problem == problemUnknown {
			r.Held++
		}
	}
	return r
}

// wrongAnswer says why op's answer is not one the upstream gave for its
// key, or "" when it is.
func wrongAnswer(h *History, op Op, execs []Execution, byID map[string]Execution) string {
	switch op.Problem {
	case "":
	case problemNotStored:
		if !op.Replayed {
			return "response-not-stored problem without Idempotent-Replayed"
		}
		for _, e := range execs {
			if e.Status == op.Status && e.Status < 500 {
				return ""
			}
		}
		return fmt.Sprintf("response-not-stored replay with status %d, which no execution of the key answered", op.Status)
	case problemUnknown:
		if h.OnUnknown != "hold" {
			return "outcome-unknown answered under ON_UNKNOWN=expire"
		}
		return ""
	case problemReused:
		return "422 key-reused, but every attempt of a key sends the same request"
	default:
		return "" // the proxy's own problems (409, 503, 502, 504): not answers of the upstream
	}
	var a upstreamAnswer
	if err := json.Unmarshal([]byte(op.Body), &a); err != nil || a.Exec == "" {
		return fmt.Sprintf("status %d with a body that is no upstream answer: %.80q", op.Status, op.Body)
	}
	if a.Key != op.Key {
		return fmt.Sprintf("answer of key %q (execution %s) given to key %q", a.Key, a.Exec, op.Key)
	}
	e, ok := byID[a.Exec]
	if !ok || e.Key != op.Key {
		return fmt.Sprintf("answer names execution %s, which the upstream never ran for this key", a.Exec)
	}
	if e.Auth != op.Auth {
		return fmt.Sprintf("answer of execution %s, of another scope (Authorization %q), given to %q", a.Exec, e.Auth, op.Auth)
	}
	if e.Status != op.Status || e.Body != op.Body {
		return fmt.Sprintf("answer %d differs from execution %s's %d (bodies equal: %v)", op.Status, e.ID, e.Status, e.Body == op.Body)
	}
	if op.Replayed && e.Status >= 500 {
		return fmt.Sprintf("5xx answer of execution %s replayed (ON_5XX=release)", e.ID)
	}
	return ""
}

// sid is the identity of a (scope, key): the Authorization value (the one
// scope header) and the key.
func sid(auth, key string) string { return auth + "\x00" + key }

// unsid is the key of a sid.
func unsid(id string) string {
	_, key, _ := strings.Cut(id, "\x00")
	return key
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
