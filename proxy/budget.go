package proxy

import (
	"errors"
	"sync/atomic"
)

// errOverBudget: taking the bytes a keyed body needs would put the replica
// over MAX_BUFFERED_BYTES.
var errOverBudget = errors.New("MAX_BUFFERED_BYTES reached: this replica holds as many request bodies and answers being recorded as it may")

// budget bounds the bytes that all keyed requests of a Handler hold in
// memory at once: their bodies, and the answers being recorded. Each
// request's own bytes are bounded (MAX_BODY_BYTES, MAX_STORED_RESPONSE_BYTES),
// their number is not: without this, a few hundred clients sending large
// bodies to a slow upstream would grow the heap until the process is
// killed, and every claim then in flight would be lost with it.
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
