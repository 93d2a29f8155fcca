package proxy

import (
	"errors"
	"sync/atomic"
)

// errOverBudget: the replica holds MAX_BUFFERED_BYTES of keyed bodies,
// answers and replays already.
var errOverBudget = errors.New("MAX_BUFFERED_BYTES reached: this replica holds as many request bodies, answers and replays in memory as it may")

// budget bounds what keyed requests hold in memory at once: their bodies
// (what has arrived, counted as it arrives), the answers being recorded
// and the records being replayed. Each of these is bounded on its own
// (MAX_BODY_BYTES, MAX_STORED_RESPONSE_BYTES), their number is not: without
// this, a few hundred clients sending large bodies to a slow upstream, or
// asking for large replays and not reading them, would grow the heap until
// the process is killed, and every claim then in flight would be lost with
// it.
//
// A keyed request is let in only while the count is below max, and its body
// only while each read still fits. An answer being recorded is counted but
// never cut for it (force): the request was executed, and the contract
// replays its answer byte for byte; it comes from the upstream, not the
// client, and keeps the next requests out until it is recorded.
type budget struct {
	max  int64 // 0: no bound
	used atomic.Int64
}

// take reserves n bytes; false, and nothing reserved, when that would
// exceed max.
func (b *budget) take(n int64) bool {
	if b.max == 0 {
		b.used.Add(n)
		return true
	}
	for {
		u := b.used.Load()
		if u+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// account is one request's share of the budget; the request gives it all
// back when it ends (Handler.finish). Only the request's goroutine uses
// it, the answer's copy included (ReverseProxy writes from it). A nil
// account bounds nothing.
type account struct {
	b    *budget
	held int64
}

// room reports whether the replica may let another keyed request in: what
// all of them hold is below the budget.
func (a *account) room() bool {
	return a == nil || a.b == nil || a.b.max == 0 || a.b.used.Load() < a.b.max
}

// admit counts n bytes if the replica may let another keyed request in (the
// count is below the budget), as a new request is let in; the count may then
// exceed the budget by n, at most one record (a replay).
func (a *account) admit(n int64) bool {
	if a == nil || a.b == nil {
		return true
	}
	b := a.b
	for {
		u := b.used.Load()
		if b.max != 0 && u >= b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			a.held += n
			return true
		}
	}
}

func (a *account) take(n int64) bool {
	if a == nil || a.b == nil {
		return true
	}
	if !a.b.take(n) {
		return false
	}
	a.held += n
	return true
}

// force counts n bytes the request holds whatever the budget says (an
// answer being recorded).
func (a *account) force(n int64) {
	if a == nil || a.b == nil || n <= 0 {
		return
	}
	a.b.used.Add(n)
	a.held += n
}

// give returns n of the account's bytes (never more than it holds).
func (a *account) give(n int64) {
	if a == nil || a.b == nil {
		return
	}
	n = min(n, a.held)
	if n <= 0 {
		return
	}
	a.held -= n
	a.b.used.Add(-n)
}

func (a *account) close() {
	if a != nil {
		a.give(a.held)
	}
}
