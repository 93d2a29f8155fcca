// Package signature verifies the signatures webhook senders put on their
// deliveries.
//
// idemproxy derives an idempotency key from a delivery (a GitHub delivery
// id, a Stripe event id, a Standard Webhooks message id) and claims it
// before forwarding the delivery once. Message ids are not secret: an
// attacker who learns or guesses one could send a forged delivery first,
// and the proxy would record the forgery and answer the genuine delivery
// as a replay of it. On routes whose key comes from a signing sender's
// preset the proxy therefore verifies the sender's signature over the raw
// body before it claims anything, and refuses the delivery when Verify
// fails, so a forged first delivery is never recorded.
//
// Verification is pure: no I/O, no logging, and the caller supplies the
// clock. Every byte of a delivery comes from an untrusted client, so
// headers are parsed strictly, the number of candidate signatures is
// capped at MaxSignatures, each secret's HMAC is computed once per
// delivery however many candidates the header lists, and the body is
// written into the HMAC in place, never copied. Errors are meant to be
// shown to the client that sent the delivery: they say why it was refused
// but never contain a secret or the signature that was received.
package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Preset names, as a route's key preset spells them.
const (
	presetGitHub           = "github"
	presetStripe           = "stripe-events"
	presetStandardWebhooks = "standard-webhooks"
	presetShopify          = "shopify"
)

var presets = []string{presetGitHub, presetStripe, presetStandardWebhooks, presetShopify}

// MaxSignatures is the most candidate signatures of the current version
// (v1) that one header may list. Senders list one, or two while they roll
// a secret; a header listing more is malformed. The cap bounds the
// comparisons a client can make the proxy do and lets candidates be
// parsed without allocating.
const MaxSignatures = 32

// DefaultTolerance is what a zero tolerance passed to New stands for:
// the five minutes both Stripe's and the Standard Webhooks libraries use.
const DefaultTolerance = 5 * time.Minute

// Errors returned by Verify wrap one of these, so that callers can tell
// the reasons apart with errors.Is (a stale delivery is worth logging
// differently from a forged one).
var (
	ErrMissingHeader   = errors.New("missing signature header")
	ErrRepeatedHeader  = errors.New("repeated signature header")
	ErrMalformedHeader = errors.New("malformed signature header")
	ErrTimestamp       = errors.New("signature timestamp outside the tolerance")
	ErrNoMatch         = errors.New("no valid signature")
)

// Presets lists the preset names New accepts.
func Presets() []string {
	return slices.Clone(presets)
}

// A Verifier checks the signatures of one sender's deliveries against one
// or more secrets. It is safe for concurrent use.
type Verifier struct {
	preset    string
	keys      [][]byte
	tolerance time.Duration
}

// New returns the Verifier of one sender; preset is the route's key preset
// name: "github", "stripe-events", "standard-webhooks" or "shopify".
//
// secrets holds one secret or more: while a secret is being rotated a
// delivery is valid if it verifies with any of them. GitHub, Stripe and
// Shopify secrets are used as raw bytes (a Stripe "whsec_..." secret
// included, as Stripe's libraries do). A Standard Webhooks secret is
// "whsec_" followed by the base64 of the key; like the reference
// libraries, New also accepts the base64 without the prefix, and like the
// Python one, without its padding.
//
// tolerance is how far a signed timestamp may be from now (Stripe and
// Standard Webhooks only); zero means DefaultTolerance.
//
// Errors name a secret by its position in the list, never by its value.
func New(preset string, secrets []string, tolerance time.Duration) (*Verifier, error) {
	if !slices.Contains(presets, preset) {
		return nil, fmt.Errorf("signature: unknown preset %q (want one of %s)", preset, strings.Join(presets, ", "))
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("signature: preset %s needs at least one secret", preset)
	}
	if tolerance < 0 {
		return nil, fmt.Errorf("signature: preset %s: negative tolerance %v", preset, tolerance)
	}
	if tolerance == 0 {
		tolerance = DefaultTolerance
	}
	v := &Verifier{preset: preset, tolerance: tolerance, keys: make([][]byte, len(secrets))}
	for i, s := range secrets {
		if s == "" {
			return nil, fmt.Errorf("signature: preset %s: secret %d of %d is empty", preset, i+1, len(secrets))
		}
		if preset != presetStandardWebhooks {
			v.keys[i] = []byte(s)
			continue
		}
		key, err := decodeStandardSecret(s)
		if err != nil {
			// err is not wrapped: a base64 error would point into the secret.
			return nil, fmt.Errorf("signature: preset %s: secret %d of %d is not whsec_ followed by base64", preset, i+1, len(secrets))
		}
		if len(key) == 0 {
			return nil, fmt.Errorf("signature: preset %s: secret %d of %d has an empty key", preset, i+1, len(secrets))
		}
		v.keys[i] = key
	}
	return v, nil
}

func decodeStandardSecret(s string) ([]byte, error) {
	s = strings.TrimPrefix(s, "whsec_")
	return base64.RawStdEncoding.Strict().DecodeString(strings.TrimRight(s, "="))
}

// Verify checks the signature of a delivery: its headers, as net/http
// received them, and its raw body. now is the proxy's clock; it is a
// parameter so that verification stays pure and testable.
//
// Verify returns nil or an error wrapping one of the Err values above,
// worded to be shown to the client.
func (v *Verifier) Verify(h http.Header, body []byte, now time.Time) error {
	switch v.preset {
	case presetGitHub:
		return v.verifyGitHub(h, body)
	case presetStripe:
		return v.verifyStripe(h, body, now)
	case presetStandardWebhooks:
		return v.verifyStandard(h, body, now)
	case presetShopify:
		return v.verifyShopify(h, body)
	}
	panic("signature: Verifier not made by New")
}

// mac is one HMAC-SHA256 value, received or computed.
type mac [sha256.Size]byte

// matches reports whether any candidate is the HMAC of prefix followed by
// body under any of v's keys. Each key's HMAC is computed once, whatever
// the number of candidates, and the body is written into it in place.
func (v *Verifier) matches(candidates []mac, prefix, body []byte) bool {
	var sum mac
	for _, key := range v.keys {
		m := hmac.New(sha256.New, key)
		m.Write(prefix)
		m.Write(body)
		m.Sum(sum[:0])
		for i := range candidates {
			if hmac.Equal(sum[:], candidates[i][:]) {
				return true
			}
		}
	}
	return false
}

// single returns the only value of the header name. A signature header
// sent twice is refused rather than resolved: picking either value would
// let a client choose which of two signatures the proxy checks.
func single(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	switch {
	case len(vs) == 0 || len(vs) == 1 && vs[0] == "":
		return "", fmt.Errorf("%w %s", ErrMissingHeader, name)
	case len(vs) > 1:
		return "", fmt.Errorf("%w %s", ErrRepeatedHeader, name)
	}
	return vs[0], nil
}

func malformed(name, why string) error {
	return fmt.Errorf("%w %s: %s", ErrMalformedHeader, name, why)
}

// parseUnix parses a timestamp in Unix seconds written as plain decimal
// digits. strconv.ParseInt would also accept a sign ("+1", "-1"), which
// no sender writes; overflow is refused rather than clamped.
func parseUnix(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// maxSpan is the largest whole number of seconds a time.Duration holds
// with a second to spare for now's fraction of a second.
const maxSpan = uint64(math.MaxInt64/int64(time.Second) - 1)

// checkTime refuses a timestamp more than v.tolerance before now and,
// when future is set, more than v.tolerance after it. The arithmetic is
// done on the integer seconds, not with time.Unix, which overflows for
// timestamps a client is free to send (such as 9223372036854775807).
func (v *Verifier) checkTime(ts int64, now time.Time, future bool) error {
	sec, frac := now.Unix(), time.Duration(now.Nanosecond())
	if ts <= sec {
		// uint64 subtraction gives the exact distance even when sec-ts
		// would overflow int64.
		d := uint64(sec) - uint64(ts)
		if d > maxSpan || time.Duration(d)*time.Second+frac > v.tolerance {
			return fmt.Errorf("%w: signed more than %v ago", ErrTimestamp, v.tolerance)
		}
		return nil
	}
	if !future {
		return nil
	}
	d := uint64(ts) - uint64(sec)
	if d > maxSpan || time.Duration(d)*time.Second-frac > v.tolerance {
		return fmt.Errorf("%w: signed more than %v in the future", ErrTimestamp, v.tolerance)
	}
	return nil
}
