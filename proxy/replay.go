package proxy

import (
	"context"
	"errors"
	"net/http"

	"github.com/idemproxy/idemproxy/claim"
)

// maxInlineReplay is the largest record a claim's reply may carry. A larger
// one is read by readLarge once MAX_BUFFERED_BYTES has counted it: else
// every concurrent replay would hold a record of up to
// MAX_STORED_RESPONSE_BYTES before it is counted. (A replay up to it holds
// about twice it uncounted while it decodes: the reply and the record.)
const maxInlineReplay = 16 << 10

// readLarge reads the record of a claim whose reply left it out for its
// size (a *claim.LargeRecordError; any other err is returned as it is):
// it counts that size in the request's account, under the rule that lets a
// replay in (over is true when there is no room: nothing was read), then
// claims again with a reply bounded to it (counted twice while it is read
// and decoded). The key may have changed in
// between (purged, and claimed or recorded anew): what comes back is
// answered as any claim's result, and a size counted for nothing is given
// back.
func (h *Handler) readLarge(ctx context.Context, k claim.Key, fp claim.Fingerprint, pol Policy, err error, res *result) (_ *claim.Lease, _ *claim.Record, _ error, over bool) {
	var large *claim.LargeRecordError
	for tries := 0; errors.As(err, &large); tries++ {
		if tries == 3 {
			// The record changed at every read: answered as a store that
			// cannot serve it (503, retry), never executed.
			return nil, nil, err, false
		}
		if !res.acct.admit(large.Size) {
			return nil, nil, nil, true
		}
		terms := claim.Terms{LockTTL: pol.LockTTL, TTL: pol.TTL, Hold: pol.Hold, MaxReplay: large.Size}
		// While it is decoded, the reply and the record are held at once.
		res.acct.force(large.Size)
		lease, rec, aerr := h.store.Acquire(context.WithoutCancel(ctx), k, fp, terms)
		res.acct.give(large.Size)
		if rec == nil || rec.Cached {
			res.acct.give(large.Size)
		} else {
			res.replayCounted = true
		}
		if errors.Is(aerr, claim.ErrInFlight) && pol.Wait > 0 {
			// Purged and claimed anew in between: waited for as any
			// duplicate is (a large answer comes back as an error again).
			lease, rec, aerr = h.acquire(ctx, k, fp, pol)
		}
		if !errors.As(aerr, &large) {
			return lease, rec, aerr, false
		}
		err = aerr
	}
	return nil, nil, err, false
}

func isLarge(err error) bool {
	var large *claim.LargeRecordError
	return errors.As(err, &large)
}

// replayedTrue is shared by every replay; nothing appends to it.
var replayedTrue = []string{"true"}[:1:1]

// replay writes a recorded answer (under the write deadline ServeHTTP set:
// a client that never reads must not hold the handler).
func (h *Handler) replay(w http.ResponseWriter, rec *claim.Record, res *result) {
	// The record is held while the client reads it (up to UPSTREAM_TIMEOUT
	// per write): counted, and let in under a new request's rule, or clients
	// that ask for large replays and never read could hold any amount. One
	// the replay cache keeps holds nothing more, nor does an empty one.
	if n := len(rec.Body); n > 0 && !rec.Cached && !res.replayCounted && !res.acct.admit(int64(n)) {
		h.metrics.bufferFull.Inc()
		res.warn().Hex("key_hash", res.key[:]).Int("body_bytes", len(rec.Body)).Int64("max_buffered_bytes", h.opts.MaxBufferedBytes).
			Msg("MAX_BUFFERED_BYTES reached: replay refused; answered 503")
		h.overloaded().write(w, res)
		return
	}
	hdr := w.Header()
	hdr["Idempotent-Replayed"] = replayedTrue
	if rec.BodyNotStored {
		notStoredAnswer(rec.Status).write(w, res)
		return
	}
	res.status, res.outcome = rec.Status, outcomeReplayed
	// The proxy's own headers win over the recorded ones, as on the first
	// answer: this answer's request id, and the key echo where there is one.
	keep := proxyHeaders(hdr, h.opts.KeyHeader)
	copyRecordable(hdr, rec.Header)
	keep.restore(hdr)
	if len(rec.Trailer) > 0 {
		// Trailers need a chunked body: no length, and announced up front.
		delete(hdr, "Content-Length")
		for name := range rec.Trailer {
			hdr.Add("Trailer", name)
		}
	}
	res.arm()
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body) // a failed write means the client left; it can retry
	for name, vv := range rec.Trailer {
		hdr[name] = vv
	}
}
