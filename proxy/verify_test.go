package proxy_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/proxy/signature"
)

// The senders' signatures, computed here from their documented algorithms
// (independently of package signature, whose own tests hold the senders'
// published examples).

func hmacSHA256(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

// sender is one signing sender as a route sees it.
type sender struct {
	preset string
	secret string // as the operator puts it in the variable verify= names
	// sign returns the headers of a delivery of body with message id id,
	// signed with secret at time at.
	sign func(secret, id, body string, at time.Time) http.Header
	// stamped: the signature covers a timestamp (SIGNATURE_TOLERANCE).
	stamped bool
}

var senders = []sender{
	{preset: "github", secret: "It's a Secret to Everybody", sign: func(secret, id, body string, _ time.Time) http.Header {
		return http.Header{"X-Github-Delivery": {id}, "X-Hub-Signature-256": {"sha256=" + hex.EncodeToString(hmacSHA256([]byte(secret), body))}}
	}},
	{preset: "stripe-events", secret: "whsec_test_secret_for_stripe", stamped: true, sign: func(secret, _, body string, at time.Time) http.Header {
		t := strconv.FormatInt(at.Unix(), 10)
		return http.Header{"Stripe-Signature": {"t=" + t + ",v1=" + hex.EncodeToString(hmacSHA256([]byte(secret), t, ".", body))}}
	}},
	{preset: "standard-webhooks", secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", stamped: true, sign: func(secret, id, body string, at time.Time) http.Header {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		if err != nil {
			key = []byte(secret) // a forger's guess
		}
		t := strconv.FormatInt(at.Unix(), 10)
		return http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {t},
			"Webhook-Signature": {"v1," + base64.StdEncoding.EncodeToString(hmacSHA256(key, id, ".", t, ".", body))}}
	}},
	{preset: "shopify", secret: "shpss_shopify_app_secret", sign: func(secret, id, body string, _ time.Time) http.Header {
		return http.Header{"X-Shopify-Event-Id": {id}, "X-Shopify-Hmac-Sha256": {base64.StdEncoding.EncodeToString(hmacSHA256([]byte(secret), body))}}
	}},
}

// delivery is the body of message id: the id in it too, where the preset
// reads it from the body (stripe-events).
func delivery(id, what string) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":%q}`, id, what)
}

// verifiedEnv is a proxy with one route for s at /hooks, keyed by s's
// preset and verifying its signature with secrets.
func verifiedEnv(t *testing.T, backend string, s sender, secrets ...string) *env {
	t.Helper()
	routes, err := proxy.ParseRoutes("POST /hooks key=" + s.preset + " scope= verify=SECRET")
	if err != nil {
		t.Fatal(err)
	}
	v, err := signature.New(s.preset, secrets, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	routes[0].Verifier = v
	return newEnv(t, backend, func(o *proxy.Options) { o.Routes = routes })
}

// TestForgedDeliveryCannotBlockTheGenuineOne: on a webhook route the key
// is the sender's message id, which is no secret. A stranger who sends a
// forged delivery with that id first must not hold the key: with verify=
// the forgery is refused (401 signature-invalid) before anything is
// claimed or forwarded, and the genuine delivery then executes once and is
// the answer replayed to its redeliveries.
func TestForgedDeliveryCannotBlockTheGenuineOne(t *testing.T) {
	t.Parallel()
	for _, backend := range bothBackends {
		for _, s := range senders {
			t.Run(backend+"/"+s.preset, func(t *testing.T) {
				e := verifiedEnv(t, backend, s, s.secret)
				id := "evt_" + s.preset + "_1"
				now := time.Now()

				forged := s.sign("not the secret", id, delivery(id, "forged"), now)
				r := e.do(req{path: "/hooks", body: delivery(id, "forged"), header: forged})
				if r.StatusCode != http.StatusUnauthorized {
					t.Fatalf("forged delivery: %d %s, want 401", r.StatusCode, r.body)
				}
				if p := r.problem(t); p["type"] != "urn:idemproxy:problem:signature-invalid" {
					t.Errorf("forged delivery: problem type %v", p["type"])
				}
				if r.Header.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
				if n := e.calls.Load(); n != 0 {
					t.Fatalf("forged delivery reached the upstream (%d calls)", n)
				}
				if keys, err := e.rdb.Keys(t.Context(), "idem:*").Result(); err != nil || len(keys) != 0 {
					t.Fatalf("forged delivery left %v in Redis (%v); want nothing claimed", keys, err)
				}

				genuine := s.sign(s.secret, id, delivery(id, "genuine"), now)
				first := e.do(req{path: "/hooks", body: delivery(id, "genuine"), header: genuine})
				if first.StatusCode != http.StatusCreated || e.calls.Load() != 1 {
					t.Fatalf("genuine delivery after the forgery: %d, upstream calls %d; want 201 and 1", first.StatusCode, e.calls.Load())
				}
				again := e.do(req{path: "/hooks", body: delivery(id, "genuine"), header: genuine})
				if again.Header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(first.body) || e.calls.Load() != 1 {
					t.Errorf("redelivery: replayed=%q body %s (first %s), upstream calls %d; want the genuine answer replayed",
						again.Header.Get("Idempotent-Replayed"), again.body, first.body, e.calls.Load())
				}
				if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"route": "/hooks", "outcome": "signature_invalid"}); got != 1 {
					t.Errorf("signature_invalid count %v, want 1", got)
				}
			})
		}
	}
}

// TestSignatureRefusals: every way a delivery can fail verification is a
// 401 before anything is claimed or forwarded: a tampered body, a missing
// or repeated signature header, a timestamp outside the tolerance (replay
// protection, for the senders that sign one).
func TestSignatureRefusals(t *testing.T) {
	t.Parallel()
	for _, s := range senders {
		t.Run(s.preset, func(t *testing.T) {
			e := verifiedEnv(t, miniBackend, s, s.secret)
			id, now := "evt_refused", time.Now()
			body := delivery(id, "x")
			signed := s.sign(s.secret, id, body, now)
			cases := map[string]req{
				"tampered body":     {path: "/hooks", body: strings.Replace(body, `"x"`, `"y"`, 1), header: signed},
				"no signature":      {path: "/hooks", body: body, header: http.Header{"X-Github-Delivery": {id}, "Webhook-Id": {id}, "X-Shopify-Event-Id": {id}}},
				"wrong secret":      {path: "/hooks", body: body, header: s.sign(s.secret+"x", id, body, now)},
				"header sent twice": {path: "/hooks", body: body, header: twice(signed)},
			}
			if s.stamped {
				cases["signed 10 minutes ago"] = req{path: "/hooks", body: body, header: s.sign(s.secret, id, body, now.Add(-10*time.Minute))}
			}
			if s.preset == "standard-webhooks" {
				cases["signed 10 minutes ahead"] = req{path: "/hooks", body: body, header: s.sign(s.secret, id, body, now.Add(10*time.Minute))}
				// The id is signed: another id under the same signature fails.
				h := signed.Clone()
				h.Set("Webhook-Id", "evt_other")
				cases["id swapped"] = req{path: "/hooks", body: body, header: h}
			}
			for name, rq := range cases {
				if r := e.do(rq); r.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s: %d %s, want 401", name, r.StatusCode, r.body)
				} else if strings.Contains(string(r.body), s.secret) {
					t.Errorf("%s: the answer quotes the secret: %s", name, r.body)
				}
			}
			if n := e.calls.Load(); n != 0 {
				t.Errorf("refused deliveries reached the upstream %d times", n)
			}
			if keys, _ := e.rdb.Keys(t.Context(), "idem:*").Result(); len(keys) != 0 {
				t.Errorf("refused deliveries claimed %v", keys)
			}
			if strings.Contains(e.logs.String(), s.secret) {
				t.Error("the log quotes the secret")
			}
			// And the delivery as signed still goes through.
			if r := e.do(req{path: "/hooks", body: body, header: signed}); r.StatusCode != http.StatusCreated {
				t.Errorf("genuine delivery: %d %s", r.StatusCode, r.body)
			}
		})
	}
}

// twice returns h with each of its signature headers sent twice.
func twice(h http.Header) http.Header {
	out := h.Clone()
	for _, name := range []string{"X-Hub-Signature-256", "Stripe-Signature", "Webhook-Signature", "X-Shopify-Hmac-Sha256"} {
		if v := out.Get(name); v != "" {
			out.Add(name, v)
		}
	}
	return out
}

// TestSignatureSecretRotation: with two secrets (verify=OLD,NEW), a
// delivery signed with either verifies; one signed with a third does not.
func TestSignatureSecretRotation(t *testing.T) {
	t.Parallel()
	for _, s := range senders {
		t.Run(s.preset, func(t *testing.T) {
			newSecret := s.secret + "2"
			if s.preset == "standard-webhooks" {
				newSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("the new signing key"))
			}
			e := verifiedEnv(t, miniBackend, s, s.secret, newSecret)
			now := time.Now()
			for i, secret := range []string{s.secret, newSecret} {
				id := fmt.Sprintf("evt_rot_%d", i)
				if r := e.do(req{path: "/hooks", body: delivery(id, "x"), header: s.sign(secret, id, delivery(id, "x"), now)}); r.StatusCode != http.StatusCreated {
					t.Errorf("signed with secret %d of 2: %d %s, want 201", i+1, r.StatusCode, r.body)
				}
			}
			third := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a third key"))
			if r := e.do(req{path: "/hooks", body: delivery("evt_rot_3", "x"), header: s.sign(third, "evt_rot_3", delivery("evt_rot_3", "x"), now)}); r.StatusCode != http.StatusUnauthorized {
				t.Errorf("signed with neither secret: %d, want 401", r.StatusCode)
			}
		})
	}
}

// TestForgedDeliveryWithoutVerificationIsReleased: without verify=, the
// upstream checks the signature itself and answers a forgery 401 or 403.
// On a route whose key is derived that answer is released, not recorded
// (as a 5xx is): the genuine delivery then executes, and its answer is the
// one replayed. record4xx=all records it instead, and the genuine delivery
// gets the forgery's 401 for the whole TTL: the risk verify= closes.
func TestForgedDeliveryWithoutVerificationIsReleased(t *testing.T) {
	gh := senders[0]
	const secret = "It's a Secret to Everybody"
	for _, tc := range []struct {
		name, spec string
		refusal    int
		released   bool
	}{
		{"401 released", "POST /hooks key=github scope=", http.StatusUnauthorized, true},
		{"403 released", "POST /hooks key=github scope=", http.StatusForbidden, true},
		{"record4xx=all records it", "POST /hooks key=github scope= record4xx=all", http.StatusUnauthorized, false},
	} {
		for _, backend := range bothBackends {
			t.Run(tc.name+"/"+backend, func(t *testing.T) {
				routes, err := proxy.ParseRoutes(tc.spec)
				if err != nil {
					t.Fatal(err)
				}
				e := newEnv(t, backend, func(o *proxy.Options) { o.Routes = routes })
				// The upstream verifies GitHub's signature itself.
				e.setUpstream(func(w http.ResponseWriter, r *http.Request) {
					body := make([]byte, r.ContentLength)
					_, _ = r.Body.Read(body)
					want := "sha256=" + hex.EncodeToString(hmacSHA256([]byte(secret), string(body)))
					if !hmac.Equal([]byte(r.Header.Get("X-Hub-Signature-256")), []byte(want)) {
						w.WriteHeader(tc.refusal)
						fmt.Fprint(w, "bad signature")
						return
					}
					w.WriteHeader(http.StatusAccepted)
					fmt.Fprintf(w, "processed %s", body)
				})
				id, body := "d-1", delivery("d-1", "push")
				now := time.Now()
				forged := e.do(req{path: "/hooks", body: body, header: gh.sign("guess", id, body, now)})
				if forged.StatusCode != tc.refusal {
					t.Fatalf("forged delivery: %d, want the upstream's %d", forged.StatusCode, tc.refusal)
				}
				genuine := e.do(req{path: "/hooks", body: body, header: gh.sign(secret, id, body, now)})
				again := e.do(req{path: "/hooks", body: body, header: gh.sign(secret, id, body, now)})
				if !tc.released {
					if genuine.StatusCode != tc.refusal || genuine.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
						t.Errorf("record4xx=all: genuine delivery %d replayed=%q, upstream calls %d; want the forgery's %d replayed",
							genuine.StatusCode, genuine.Header.Get("Idempotent-Replayed"), e.calls.Load(), tc.refusal)
					}
					return
				}
				if genuine.StatusCode != http.StatusAccepted || genuine.Header.Get("Idempotent-Replayed") != "" {
					t.Fatalf("genuine delivery after a forgery: %d replayed=%q %s; want it executed (202)",
						genuine.StatusCode, genuine.Header.Get("Idempotent-Replayed"), genuine.body)
				}
				if again.StatusCode != http.StatusAccepted || again.Header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(genuine.body) {
					t.Errorf("redelivery: %d replayed=%q %s; want the genuine answer replayed", again.StatusCode, again.Header.Get("Idempotent-Replayed"), again.body)
				}
				if n := e.calls.Load(); n != 2 {
					t.Errorf("upstream calls %d, want 2 (the forgery, the genuine delivery)", n)
				}
				if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"route": "/hooks", "outcome": "released"}); got != 1 {
					t.Errorf("released count %v, want 1", got)
				}
			})
		}
	}
}

// TestHeaderKeyRoutesRecord401: where the key is the client's own
// Idempotency-Key (scoped by its credentials), a 401 stays recorded, as
// the contract's table says.
func TestHeaderKeyRoutesRecord401(t *testing.T) {
	t.Parallel()
	e := newEnv(t, miniBackend, nil)
	e.setUpstream(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) })
	e.do(req{path: "/v1/orders", key: "k1", body: "{}"})
	r := e.do(req{path: "/v1/orders", key: "k1", body: "{}"})
	if r.StatusCode != http.StatusUnauthorized || r.Header.Get("Idempotent-Replayed") != "true" || e.calls.Load() != 1 {
		t.Errorf("header key, upstream 401: retry %d replayed=%q, upstream calls %d; want the 401 replayed", r.StatusCode, r.Header.Get("Idempotent-Replayed"), e.calls.Load())
	}
}

// TestSignatureInObserveMode: observe changes no answer: a delivery whose
// signature fails is forwarded as it is, unclaimed, and counted
// would_reject.
func TestSignatureInObserveMode(t *testing.T) {
	t.Parallel()
	s := senders[0]
	routes, err := proxy.ParseRoutes("POST /hooks key=github scope= verify=SECRET observe")
	if err != nil {
		t.Fatal(err)
	}
	v, err := signature.New("github", []string{s.secret}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	routes[0].Verifier = v
	e := newEnv(t, miniBackend, func(o *proxy.Options) { o.Routes = routes })
	body := delivery("d-obs", "x")
	r := e.do(req{path: "/hooks", body: body, header: s.sign("wrong", "d-obs", body, time.Now())})
	if r.StatusCode != http.StatusCreated || e.calls.Load() != 1 {
		t.Fatalf("observe, bad signature: %d, upstream calls %d; want forwarded", r.StatusCode, e.calls.Load())
	}
	if keys, _ := e.rdb.Keys(t.Context(), "idem:*").Result(); len(keys) != 0 {
		t.Errorf("observe, bad signature: claimed %v", keys)
	}
	if got := counter(t, e.reg, "idemproxy_requests_total", map[string]string{"route": "/hooks", "outcome": "would_reject"}); got != 1 {
		t.Errorf("would_reject count %v, want 1", got)
	}
}

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
