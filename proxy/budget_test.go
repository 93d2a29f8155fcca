package proxy

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestBudgetNeverExceeded: accounts taking and giving back concurrently
// never hold more than the budget together, and give it all back.
func TestBudgetNeverExceeded(t *testing.T) {
	b := &budget{max: 10_000}
	var peak atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				a := account{b: b}
				for j := range 5 {
					if a.take(int64(100 + (g*7+i+j)%900)) {
						if u := b.used.Load(); u > peak.Load() {
							peak.Store(u)
						}
					}
				}
				a.give(50)
				a.close()
				a.close() // twice gives nothing more
			}
		}()
	}
	wg.Wait()
	if u := b.used.Load(); u != 0 {
		t.Errorf("used after every account closed: %d, want 0", u)
	}
	if p := peak.Load(); p > b.max || p == 0 {
		t.Errorf("peak %d, want above 0 and at most %d", p, b.max)
	}
	if b.take(b.max+1) || b.used.Load() != 0 {
		t.Errorf("a take above the budget succeeded or left bytes taken")
	}
	var none *account // a nil account bounds nothing
	if !none.take(1 << 40) {
		t.Error("nil account refused")
	}
	none.give(1)
	none.close()
}
