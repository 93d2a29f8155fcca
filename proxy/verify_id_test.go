package proxy_test

import (
	"net/http"
	"testing"
	"time"
)

// TestSignedBodyCannotClaimAnotherDeliverysID: verify= exists so that
// whoever learns a message id cannot claim it before the sender does. With
// GitHub and Shopify the id (X-GitHub-Delivery, X-Shopify-Event-Id) is not
// covered by the signature, which signs the body alone. A stranger holding
// one genuine delivery (a body and its signature, from a log, a proxy, an
// APM trace) can send it again under the id of a delivery yet to come: the
// signature verifies, the old event executes again, and its answer holds
// the new id. The genuine delivery with that id then gets 422 (strict:
// GitHub never retries it) or, with fingerprint=none as the README advises
// for Shopify, the old event's answer replayed: either way it is never
// executed. A delivery whose id the signature does not vouch for must not
// decide what the genuine delivery with that id gets. (Standard Webhooks
// signs its id, and Stripe's id is in the signed body: both hold.)
func TestSignedBodyCannotClaimAnotherDeliverysID(t *testing.T) {
	for _, backend := range bothBackends {
		for _, s := range senders {
			if s.preset == "stripe-events" {
				continue // the key is read from the signed body: no id to swap
			}
			t.Run(backend+"/"+s.preset, func(t *testing.T) {
				e := verifiedEnv(t, backend, s, s.secret)
				now := time.Now()

				// A genuine delivery, executed and recorded.
				oldID, oldBody := "delivery-1", delivery("delivery-1", "issues.opened")
				old := s.sign(s.secret, oldID, oldBody, now)
				if r := e.do(req{path: "/hooks", body: oldBody, header: old}); r.StatusCode != http.StatusCreated {
					t.Fatalf("genuine delivery 1: %d %s", r.StatusCode, r.body)
				}

				// The stranger sends it again under the next delivery's id.
				nextID := "delivery-2"
				swapped := old.Clone()
				for _, h := range []string{"X-Github-Delivery", "X-Shopify-Event-Id", "Webhook-Id"} {
					if swapped.Get(h) != "" {
						swapped.Set(h, nextID)
					}
				}
				r := e.do(req{path: "/hooks", body: oldBody, header: swapped})
				t.Logf("delivery 1 re-sent under id %s: %d", nextID, r.StatusCode)

				// The genuine delivery 2.
				before := e.calls.Load()
				newBody := delivery(nextID, "issues.closed")
				g := e.do(req{path: "/hooks", body: newBody, header: s.sign(s.secret, nextID, newBody, now)})
				if g.StatusCode != http.StatusCreated || g.Header.Get("Idempotent-Replayed") == "true" || e.calls.Load() != before+1 {
					t.Errorf("genuine delivery %s after a re-sent signed body claimed its id: %d replayed=%q, upstream calls %d -> %d; want it executed (201)",
						nextID, g.StatusCode, g.Header.Get("Idempotent-Replayed"), before, e.calls.Load())
				}
			})
		}
	}
}
