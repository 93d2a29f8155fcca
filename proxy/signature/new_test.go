package signature_test

import (
	"encoding/base64"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy/signature"
)

func TestPresets(t *testing.T) {
	want := []string{"github", "stripe-events", "standard-webhooks", "shopify"}
	got := signature.Presets()
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	got[0] = "changed"
	if got := signature.Presets(); !slices.Equal(got, want) {
		t.Errorf("after changing a returned slice: got %v, want %v", got, want)
	}
	for _, p := range want {
		if _, err := signature.New(p, []string{"c2VjcmV0LWtleS1ieXRlcw=="}, 0); err != nil {
			t.Errorf("New(%s): got %v, want nil", p, err)
		}
	}
}

func TestNewErrors(t *testing.T) {
	const secret = "whsec_not base64 at all!"
	tests := []struct {
		name      string
		preset    string
		secrets   []string
		tolerance time.Duration
		want      string
	}{
		{"unknown preset", "gitlab", []string{"s"}, 0,
			`signature: unknown preset "gitlab" (want one of github, stripe-events, standard-webhooks, shopify)`},
		{"no secrets", "github", nil, 0, "signature: preset github needs at least one secret"},
		{"empty secret", "shopify", []string{"s3cr3t-value", ""}, 0, "signature: preset shopify: secret 2 of 2 is empty"},
		{"negative tolerance", "stripe-events", []string{"whsec_x"}, -time.Second,
			"signature: preset stripe-events: negative tolerance -1s"},
		{"standard secret not base64", "standard-webhooks", []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", secret}, 0,
			"signature: preset standard-webhooks: secret 2 of 2 is not whsec_ followed by base64"},
		{"standard secret url base64", "standard-webhooks", []string{"whsec_" + base64.URLEncoding.EncodeToString([]byte{0xfb, 0xff, 0xfe})}, 0,
			"signature: preset standard-webhooks: secret 1 of 1 is not whsec_ followed by base64"},
		{"standard secret empty key", "standard-webhooks", []string{"whsec_"}, 0,
			"signature: preset standard-webhooks: secret 1 of 1 has an empty key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := signature.New(tc.preset, tc.secrets, tc.tolerance)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if v != nil {
				t.Errorf("got %v, want nil Verifier", v)
			}
			for _, s := range tc.secrets {
				if len(s) > 6 && strings.Contains(err.Error(), strings.TrimPrefix(s, "whsec_")) {
					t.Errorf("error %q contains a secret", err)
				}
			}
		})
	}
}

// The reference libraries strip an optional whsec_ prefix, and the Python
// one adds the padding a secret may lack.
func TestNewStandardSecretForms(t *testing.T) {
	key := []byte("a 25-byte key, padded ==!")
	padded := base64.StdEncoding.EncodeToString(key)
	if !strings.HasSuffix(padded, "=") {
		t.Fatalf("test key %q needs padding", padded)
	}
	signed := senders[2].deliver("whsec_"+padded, nowTS, body)
	for _, secret := range []string{
		"whsec_" + padded,
		padded,
		"whsec_" + strings.TrimRight(padded, "="),
		strings.TrimRight(padded, "="),
	} {
		t.Run(secret, func(t *testing.T) {
			v := mustNew(t, "standard-webhooks", secret)
			if err := v.Verify(signed, []byte(body), now); err != nil {
				t.Errorf("got %v, want nil", err)
			}
		})
	}
}

// A Stripe secret is used as it is written, prefix included, and never
// base64-decoded, even when it happens to be valid base64.
func TestNewStripeSecretIsRaw(t *testing.T) {
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("raw-bytes-key"))
	ts := strconv.FormatInt(nowTS, 10)
	raw := mac256([]byte(secret), ts, ".", body)
	decoded := mac256([]byte("raw-bytes-key"), ts, ".", body)
	v := mustNew(t, "stripe-events", secret)
	tests := []struct {
		name string
		mac  []byte
		want error
	}{
		{"raw secret", raw, nil},
		{"decoded secret", decoded, signature.ErrNoMatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Stripe-Signature": {"t=" + ts + ",v1=" + hexOf(tc.mac)}}
			if err := v.Verify(h, []byte(body), now); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestNewZeroToleranceIsDefault(t *testing.T) {
	s := senders[1]
	v, err := signature.New(s.preset, []string{s.secrets[0]}, 0)
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	def := int64(signature.DefaultTolerance / time.Second)
	tests := []struct {
		name string
		ts   int64
		want error
	}{
		{"inside", nowTS - def, nil},
		{"outside", nowTS - def - 1, signature.ErrTimestamp},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := v.Verify(s.deliver(s.secrets[0], tc.ts, body), []byte(body), now); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}
