package claim_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview14gLongTraceRecordedInBothForms: the string codec keeps each
// field but rec behind one length byte (string.char(#s) in enc), so a field
// of 256 bytes or more makes the script fail. Record.Trace is a free string
// of the public API (the proxy writes 49 bytes, a library user may write a
// W3C traceparent with tracestate, or anything): in hash form it is stored,
// in string form Complete fails after its ~5 s of retries and the answer is
// lost (the key stays in flight until its lock expires: then executed again,
// or held unknown). The form must not change what can be recorded.
func TestReview14gLongTraceRecordedInBothForms(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	tr := strings.Repeat("a", 256)
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			s := claim.NewStore(rdb, "trace256:"+f.name+":", nil, claim.StringRecords(f.str))
			k := claim.NewKey(nil, "long trace")
			lease, _, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
			if err != nil || lease == nil {
				t.Fatalf("claim: %v, %v", lease, err)
			}
			start := time.Now()
			if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: []byte("ok"), Trace: tr}, time.Hour); err != nil {
				t.Fatalf("Complete with a %d-byte Trace (%s records): %v (after %v)", len(tr), f.name, err, time.Since(start).Round(time.Millisecond))
			}
			// Recorded in both forms; a Trace that is not a trace context
			// ("<trace-id>-<span-id>", Record.Trace) is dropped in both.
			if _, rec, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour}); err != nil || rec == nil || string(rec.Body) != "ok" || rec.Trace != "" {
				t.Errorf("replay: %+v, %v; want the answer, without the trace", rec, err)
			}
		})
	}
}
