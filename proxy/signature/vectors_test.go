package signature_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy/signature"
)

// The senders' own published examples, used verbatim.
func TestPublishedVectors(t *testing.T) {
	tests := []struct {
		name    string
		preset  string
		secrets []string
		header  http.Header
		body    string
		now     time.Time
	}{
		{
			// https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
			// ("Testing the webhook payload validation").
			name:    "github docs",
			preset:  "github",
			secrets: []string{"It's a Secret to Everybody"},
			header:  http.Header{"X-Hub-Signature-256": {"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"}},
			body:    "Hello, World!",
		},
		{
			// github.com/standard-webhooks/standard-webhooks,
			// libraries/go/webhook_test.go, TestWebhookSign.
			name:    "standard webhooks go library",
			preset:  "standard-webhooks",
			secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
			header: http.Header{
				"Webhook-Id":        {"msg_p5jXN8AQM9LWM0D4loKWxJek"},
				"Webhook-Timestamp": {"1614265330"},
				"Webhook-Signature": {"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
			},
			body: `{"test": 2432232314}`,
			now:  time.Unix(1614265330, 0),
		},
		{
			// The same vector with the secret's bare base64, which the
			// reference libraries also accept (TestWebhookPrefix there).
			name:    "standard webhooks go library, secret without prefix",
			preset:  "standard-webhooks",
			secrets: []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
			header: http.Header{
				"Webhook-Id":        {"msg_p5jXN8AQM9LWM0D4loKWxJek"},
				"Webhook-Timestamp": {"1614265330"},
				"Webhook-Signature": {"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
			},
			body: `{"test": 2432232314}`,
			now:  time.Unix(1614265330, 0),
		},
		{
			// github.com/standard-webhooks/standard-webhooks,
			// libraries/rust/src/lib.rs, test_sign.
			name:    "standard webhooks rust library",
			preset:  "standard-webhooks",
			secrets: []string{"whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"},
			header: http.Header{
				"Webhook-Id":        {"msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"},
				"Webhook-Timestamp": {"1649367553"},
				"Webhook-Signature": {"v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="},
			},
			body: `{"email":"test@example.com","username":"test_user"}`,
			now:  time.Unix(1649367553, 0),
		},
		{
			// github.com/Shopify/shopify_app,
			// test/shopify_app/controller_concerns/webhook_verification_test.rb:
			// secret "secret", body the form encoding of {foo: 'anything'}.
			name:    "shopify_app new secret",
			preset:  "shopify",
			secrets: []string{"secret"},
			header:  http.Header{"X-Shopify-Hmac-Sha256": {"yCGX/RrK4fcuNtr3ztk5tQGsOBjcAzHpGLdMUrbV8yI="}},
			body:    "foo=anything",
		},
		{
			// Same file: the old secret during a rotation.
			name:    "shopify_app old secret during rotation",
			preset:  "shopify",
			secrets: []string{"secret", "old_secret"},
			header:  http.Header{"X-Shopify-Hmac-Sha256": {"XqRcjrSv57VACn6apEO9znyu/wkN1VC7QxdSPwK3Hzs="}},
			body:    "foo=anything",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := signature.New(tc.preset, tc.secrets, 0)
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			if err := v.Verify(tc.header, []byte(tc.body), tc.now); err != nil {
				t.Errorf("got %v, want nil", err)
			}
			if err := v.Verify(tc.header, []byte(tc.body+" "), tc.now); !errors.Is(err, signature.ErrNoMatch) {
				t.Errorf("longer body: got %v, want %v", err, signature.ErrNoMatch)
			}
		})
	}
}

// Stripe publishes no example with its secret: the header in its docs
// (t=1492774577,v1=5257a869...) comes without the secret that signed it,
// and stripe-go's own tests compute their signatures with ComputeSignature.
// So the expected value is computed here from the documented algorithm,
// HMAC-SHA256(secret, "<t>.<body>") in hex, by code independent of the
// package.
func TestStripeDocumentedAlgorithm(t *testing.T) {
	const (
		secret = "whsec_test_secret"
		body   = `{"id":"evt_test_webhook","object":"event"}`
		ts     = "1492774577"
	)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "." + body))
	header := http.Header{"Stripe-Signature": {"t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil)) + ",v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"}}

	v, err := signature.New("stripe-events", []string{secret}, 0)
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	if err := v.Verify(header, []byte(body), time.Unix(1492774577, 0)); err != nil {
		t.Errorf("got %v, want nil", err)
	}
}
