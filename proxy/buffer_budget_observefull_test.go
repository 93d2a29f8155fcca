package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// TestBufferBudgetObserveNotCountedAsRefused: idemproxy_buffer_full_total
// (and the IdemproxyBufferFull alert) count requests answered 503
// overloaded, nothing executed; in observe mode the request is forwarded and
// executed instead, and is not counted there. (Found by review.)
func TestBufferBudgetObserveNotCountedAsRefused(t *testing.T) {
	forBoth(t, func(o *proxy.Options) {
		budgetOptions(o)
		o.Default.Observe = true
	}, func(t *testing.T, e *env) {
		g := newGate()
		defer g.open()
		e.setUpstream(gatedHeld(e, g))
		first := holdOne(t, e, g, "held", 40<<10)

		big := strings.Repeat("o", 40<<10)
		r := e.do(req{key: "observed", body: big})
		if r.StatusCode != http.StatusCreated || !strings.Contains(string(r.body), fmt.Sprintf(`"body_len":%d`, len(big))) {
			t.Fatalf("observe: status %d %s, want the upstream's 201", r.StatusCode, r.body)
		}
		g.open()
		<-first
		eventually(t, 5*time.Second, "every byte given back", func() bool { return bufferedBytes(t, e) == 0 })
		if got := counter(t, e.reg, "idemproxy_buffer_full_total", nil); got != 0 {
			t.Errorf("idemproxy_buffer_full_total %v after a request that was forwarded and executed (observe mode), want 0: "+
				"the series (and IdemproxyBufferFull) say 503 and nothing executed", got)
		}
	})
}
