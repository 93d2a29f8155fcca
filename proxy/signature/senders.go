package signature

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names as the senders document them; http.Header.Values
// canonicalizes them for the lookup.
const (
	headerGitHub            = "X-Hub-Signature-256"
	headerStripe            = "Stripe-Signature"
	headerStandardID        = "webhook-id"
	headerStandardTimestamp = "webhook-timestamp"
	headerStandardSignature = "webhook-signature"
	headerShopify           = "X-Shopify-Hmac-Sha256"
)

// verifyGitHub checks "sha256=" followed by the hex HMAC-SHA256 of the
// body, as https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
// describes.
func (v *Verifier) verifyGitHub(h http.Header, body []byte) error {
	s, err := single(h, headerGitHub)
	if err != nil {
		return err
	}
	var c [1]mac
	sig, ok := strings.CutPrefix(s, "sha256=")
	if !ok || !decodeHex(&c[0], sig) {
		return malformed(headerGitHub, "want sha256= followed by 64 hex digits")
	}
	if !v.matches(c[:], nil, body) {
		return fmt.Errorf("%w: %s does not match the body", ErrNoMatch, headerGitHub)
	}
	return nil
}

// verifyStripe checks a header such as "t=1492774577,v1=<hex>,v1=<hex>,v0=<hex>":
// the HMAC-SHA256 of "<t>.<body>" must equal one of the v1 values
// (https://docs.stripe.com/webhooks#verify-manually).
//
// It follows stripe-go's webhook.ValidatePayloadWithTolerance: unknown
// keys (v0, and any Stripe may add) are ignored, an item that is not
// exactly one key=value pair makes the header invalid, and the payload is
// signed with the timestamp as a decimal integer. It is stricter where
// stripe-go is lenient in ways Stripe never relies on: a v1 that is not
// 64 hex digits is malformed rather than skipped, and a repeated or
// missing t is malformed rather than resolved to the last value or to the
// zero time.
//
// Only old timestamps are refused. stripe-go computes
// time.Since(t) > tolerance, so a timestamp in the future has a negative
// age and passes whatever its distance; Verify does the same, so that a
// sender whose clock runs ahead is accepted here exactly as by Stripe's
// own library. Replaying a genuine delivery still needs its signature,
// which covers the timestamp.
func (v *Verifier) verifyStripe(h http.Header, body []byte, now time.Time) error {
	s, err := single(h, headerStripe)
	if err != nil {
		return err
	}
	var (
		ts    int64
		haveT bool
		cands [MaxSignatures]mac
		n     int
	)
	for item := range strings.SplitSeq(s, ",") {
		key, val, ok := strings.Cut(item, "=")
		if !ok || strings.Contains(val, "=") {
			return malformed(headerStripe, "want comma-separated key=value items")
		}
		switch key {
		case "t":
			if haveT {
				return malformed(headerStripe, "more than one t")
			}
			if ts, haveT = parseUnix(val); !haveT {
				return malformed(headerStripe, "t is not a decimal Unix time")
			}
		case "v1":
			if n == len(cands) {
				return malformed(headerStripe, fmt.Sprintf("more than %d v1 signatures", MaxSignatures))
			}
			if !decodeHex(&cands[n], val) {
				return malformed(headerStripe, "v1 is not 64 hex digits")
			}
			n++
		}
	}
	if !haveT {
		return malformed(headerStripe, "no t")
	}
	if n == 0 {
		return fmt.Errorf("%w: %s has no v1 signature", ErrNoMatch, headerStripe)
	}
	if err := v.checkTime(ts, now, false); err != nil {
		return err
	}
	var buf [24]byte
	prefix := append(strconv.AppendInt(buf[:0], ts, 10), '.')
	if !v.matches(cands[:n], prefix, body) {
		return fmt.Errorf("%w: no v1 signature in %s matches the body", ErrNoMatch, headerStripe)
	}
	return nil
}

// verifyStandard checks a Standard Webhooks delivery
// (https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md):
// webhook-signature lists space-separated "version,base64" entries, and
// one v1 entry must be the HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>".
// Entries of other versions (v1a, an asymmetric signature) are skipped, as
// the reference libraries skip them. Timestamps too old and too new are
// both refused, as the reference libraries refuse them.
func (v *Verifier) verifyStandard(h http.Header, body []byte, now time.Time) error {
	id, err := single(h, headerStandardID)
	if err != nil {
		return err
	}
	tsText, err := single(h, headerStandardTimestamp)
	if err != nil {
		return err
	}
	s, err := single(h, headerStandardSignature)
	if err != nil {
		return err
	}
	// The spec requires ids without a full stop. Refusing them keeps the
	// signed string unambiguous: with a dot allowed, the signature of
	// id "a.1", timestamp t also covers id "a", timestamp 1 and a body
	// starting with "t.", and the id is the idempotency key the proxy is
	// about to claim.
	if strings.Contains(id, ".") {
		return malformed(headerStandardID, "contains a full stop")
	}
	ts, ok := parseUnix(tsText)
	if !ok {
		return malformed(headerStandardTimestamp, "not a decimal Unix time")
	}
	var (
		cands [MaxSignatures]mac
		n     int
	)
	for entry := range strings.SplitSeq(s, " ") {
		if entry == "" {
			continue // the reference libraries tolerate doubled spaces
		}
		version, sig, ok := strings.Cut(entry, ",")
		if !ok {
			return malformed(headerStandardSignature, "want space-separated version,signature entries")
		}
		if version != "v1" {
			continue
		}
		if n == len(cands) {
			return malformed(headerStandardSignature, fmt.Sprintf("more than %d v1 signatures", MaxSignatures))
		}
		if !decodeBase64(&cands[n], sig) {
			return malformed(headerStandardSignature, "v1 is not the base64 of 32 bytes")
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%w: %s has no v1 signature", ErrNoMatch, headerStandardSignature)
	}
	if err := v.checkTime(ts, now, true); err != nil {
		return err
	}
	prefix := make([]byte, 0, len(id)+len("..")+20)
	prefix = append(prefix, id...)
	prefix = append(prefix, '.')
	prefix = strconv.AppendInt(prefix, ts, 10)
	prefix = append(prefix, '.')
	if !v.matches(cands[:n], prefix, body) {
		return fmt.Errorf("%w: no v1 signature in %s matches the body", ErrNoMatch, headerStandardSignature)
	}
	return nil
}

// verifyShopify checks the base64 HMAC-SHA256 of the body
// (https://shopify.dev/docs/apps/build/webhooks/subscribe/https).
func (v *Verifier) verifyShopify(h http.Header, body []byte) error {
	s, err := single(h, headerShopify)
	if err != nil {
		return err
	}
	var c [1]mac
	if !decodeBase64(&c[0], s) {
		return malformed(headerShopify, "want the base64 of 32 bytes")
	}
	if !v.matches(c[:], nil, body) {
		return fmt.Errorf("%w: %s does not match the body", ErrNoMatch, headerShopify)
	}
	return nil
}

func decodeHex(dst *mac, s string) bool {
	if len(s) != hex.EncodedLen(len(dst)) {
		return false
	}
	_, err := hex.Decode(dst[:], []byte(s))
	return err == nil
}

// strictBase64 takes only the canonical padded encoding, so one MAC has
// one spelling, as it does for the libraries that compare encoded strings.
var strictBase64 = base64.StdEncoding.Strict()

func decodeBase64(dst *mac, s string) bool {
	if len(s) != strictBase64.EncodedLen(len(dst)) {
		return false
	}
	var buf [sha256.Size + 1]byte // DecodedLen of 44 characters is 33
	n, err := strictBase64.Decode(buf[:], []byte(s))
	if err != nil || n != len(dst) {
		return false
	}
	copy(dst[:], buf[:n])
	return true
}
