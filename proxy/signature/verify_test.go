package signature_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy/signature"
)

var (
	now       = time.Unix(1700000000, 0)
	tolerance = 5 * time.Minute
	tolSec    = int64(tolerance / time.Second)
	nowTS     = now.Unix()
)

const msgID = "msg_p5jXN8AQM9LWM0D4loKWxJek"

// mac256 is the test's own HMAC, independent of the package's.
func mac256(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

func standardKey(secret string) []byte {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		panic(err)
	}
	return key
}

// A sender knows how to sign deliveries the way one real sender does.
type sender struct {
	preset string
	// secrets are an old and a new secret, and one no verifier holds.
	secrets [3]string
	// header carries the signatures.
	header string
	// candidate is one signature, encoded as the header lists it.
	candidate func(secret string, ts int64, body string) string
	// headers builds a delivery's headers listing the candidates.
	headers func(ts int64, candidates ...string) http.Header
	// timed senders sign a timestamp; future ones also refuse it too new.
	timed, future bool
	// malformed header values, set over a valid delivery.
	malformed []struct{ header, value string }
}

func (s sender) deliver(secret string, ts int64, body string) http.Header {
	return s.headers(ts, s.candidate(secret, ts, body))
}

type headerValue = struct{ header, value string }

var (
	hex64 = strings.Repeat("ab", 32)
	b64   = base64.StdEncoding.EncodeToString(make([]byte, 32))
)

var senders = []sender{
	{
		preset:  "github",
		secrets: [3]string{"It's a Secret to Everybody", "gh-new-secret", "gh-unrelated"},
		header:  "X-Hub-Signature-256",
		candidate: func(secret string, _ int64, body string) string {
			return hex.EncodeToString(mac256([]byte(secret), body))
		},
		headers: func(_ int64, c ...string) http.Header {
			return http.Header{"X-Hub-Signature-256": {"sha256=" + c[0]}}
		},
		malformed: []headerValue{
			{"X-Hub-Signature-256", hex64},
			{"X-Hub-Signature-256", "sha1=" + hex64},
			{"X-Hub-Signature-256", "SHA256=" + hex64},
			{"X-Hub-Signature-256", "sha256=" + hex64[:63]},
			{"X-Hub-Signature-256", "sha256=" + hex64 + "ab"},
			{"X-Hub-Signature-256", "sha256=" + strings.Repeat("zz", 32)},
			{"X-Hub-Signature-256", "sha256= " + hex64},
			{"X-Hub-Signature-256", "sha256=" + hex64 + ",sha256=" + hex64},
		},
	},
	{
		preset:  "stripe-events",
		secrets: [3]string{"whsec_old_0123456789abcdef", "whsec_new_0123456789abcdef", "whsec_unrelated"},
		header:  "Stripe-Signature",
		candidate: func(secret string, ts int64, body string) string {
			return hex.EncodeToString(mac256([]byte(secret), strconv.FormatInt(ts, 10), ".", body))
		},
		headers: func(ts int64, c ...string) http.Header {
			var v strings.Builder
			v.WriteString("t=" + strconv.FormatInt(ts, 10))
			for _, s := range c {
				v.WriteString(",v1=" + s)
			}
			return http.Header{"Stripe-Signature": {v.String()}}
		},
		timed: true,
		malformed: []headerValue{
			{"Stripe-Signature", "v1=" + hex64},
			{"Stripe-Signature", "t=,v1=" + hex64},
			{"Stripe-Signature", "t=abc,v1=" + hex64},
			{"Stripe-Signature", "t=-1700000000,v1=" + hex64},
			{"Stripe-Signature", "t=+1700000000,v1=" + hex64},
			{"Stripe-Signature", "t= 1700000000,v1=" + hex64},
			{"Stripe-Signature", "t=1700000000.5,v1=" + hex64},
			{"Stripe-Signature", "t=1_700_000_000,v1=" + hex64},
			{"Stripe-Signature", "t=9223372036854775808,v1=" + hex64},
			{"Stripe-Signature", "t=1700000000,t=1700000000,v1=" + hex64},
			{"Stripe-Signature", "t=1700000000,v1=" + strings.Repeat("zz", 32)},
			{"Stripe-Signature", "t=1700000000,v1=" + hex64[:62]},
			{"Stripe-Signature", "t=1700000000,v1=" + hex64 + ","},
			{"Stripe-Signature", "t=1700000000;v1=" + hex64},
			{"Stripe-Signature", "t=1700000000,v1=" + hex64 + "="},
		},
	},
	{
		preset: "standard-webhooks",
		secrets: [3]string{
			"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
			"whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
			"whsec_" + base64.StdEncoding.EncodeToString([]byte("a key no verifier holds!")),
		},
		header: "webhook-signature",
		candidate: func(secret string, ts int64, body string) string {
			return base64.StdEncoding.EncodeToString(mac256(standardKey(secret), msgID, ".", strconv.FormatInt(ts, 10), ".", body))
		},
		headers: func(ts int64, c ...string) http.Header {
			h := http.Header{}
			h.Set("webhook-id", msgID)
			h.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
			entries := make([]string, len(c))
			for i, s := range c {
				entries[i] = "v1," + s
			}
			h.Set("webhook-signature", strings.Join(entries, " "))
			return h
		},
		timed:  true,
		future: true,
		malformed: []headerValue{
			{"webhook-signature", "v1"},
			{"webhook-signature", b64},
			{"webhook-signature", "v1," + b64 + ",v1," + b64},
			{"webhook-signature", "v1,"},
			{"webhook-signature", "v1,not base64!"},
			{"webhook-signature", "v1," + base64.StdEncoding.EncodeToString(make([]byte, 31))},
			{"webhook-signature", "v1," + base64.RawStdEncoding.EncodeToString(make([]byte, 32))},
			{"webhook-signature", "v1," + b64[:42] + "B="}, // non-zero trailing bits
			{"webhook-timestamp", "-1700000000"},
			{"webhook-timestamp", "+1700000000"},
			{"webhook-timestamp", " 1700000000"},
			{"webhook-timestamp", "1700000000.0"},
			{"webhook-timestamp", "0x6553f100"},
			{"webhook-timestamp", "99999999999999999999"},
			{"webhook-id", "msg.1700000000"},
		},
	},
	{
		preset:  "shopify",
		secrets: [3]string{"secret", "old_secret", "shop-unrelated"},
		header:  "X-Shopify-Hmac-Sha256",
		candidate: func(secret string, _ int64, body string) string {
			return base64.StdEncoding.EncodeToString(mac256([]byte(secret), body))
		},
		headers: func(_ int64, c ...string) http.Header {
			return http.Header{"X-Shopify-Hmac-Sha256": {c[0]}}
		},
		malformed: []headerValue{
			{"X-Shopify-Hmac-Sha256", hex64},
			{"X-Shopify-Hmac-Sha256", base64.RawStdEncoding.EncodeToString(make([]byte, 32))},
			{"X-Shopify-Hmac-Sha256", base64.URLEncoding.EncodeToString(bytesOf(0xfb, 32))},
			{"X-Shopify-Hmac-Sha256", b64[:42] + "B="},
			{"X-Shopify-Hmac-Sha256", b64 + b64},
			{"X-Shopify-Hmac-Sha256", "sha256=" + b64},
		},
	},
}

func bytesOf(b byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = b
	}
	return p
}

func mustNew(t *testing.T, preset string, secrets ...string) *signature.Verifier {
	t.Helper()
	v, err := signature.New(preset, secrets, tolerance)
	if err != nil {
		t.Fatalf("New(%s): got %v, want nil", preset, err)
	}
	return v
}

// checkNoLeak fails when err's text contains a secret or any long token
// of the signature headers that were received.
func checkNoLeak(t *testing.T, err error, h http.Header, secrets []string) {
	t.Helper()
	if err == nil {
		return
	}
	msg := err.Error()
	for _, s := range secrets {
		if strings.Contains(msg, s) || strings.Contains(msg, strings.TrimPrefix(s, "whsec_")) {
			t.Errorf("error %q contains a secret", msg)
		}
	}
	for _, vs := range h {
		for _, v := range vs {
			for _, tok := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == '=' || r == ' ' }) {
				if len(tok) >= 16 && strings.Contains(msg, tok) {
					t.Errorf("error %q echoes the received %q", msg, tok)
				}
			}
		}
	}
}

type verifyCase struct {
	name    string
	secrets []string
	h       http.Header
	body    string
	now     time.Time
	want    error
}

func runCases(t *testing.T, s sender, cases []verifyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(s.preset+"/"+tc.name, func(t *testing.T) {
			v := mustNew(t, s.preset, tc.secrets...)
			at := tc.now
			if at.IsZero() {
				at = now
			}
			err := v.Verify(tc.h, []byte(tc.body), at)
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			checkNoLeak(t, err, tc.h, s.secrets[:])
		})
	}
}

const body = `{"action":"opened","delivery":"72d3162e-cc78-11e3-81ab-4c9367dc0958"}`

func TestVerify(t *testing.T) {
	for _, s := range senders {
		oldS, newS, other := s.secrets[0], s.secrets[1], s.secrets[2]
		valid := s.deliver(oldS, nowTS, body)
		with := func(f func(h http.Header)) http.Header {
			h := valid.Clone()
			f(h)
			return h
		}
		tampered := []byte(body)
		tampered[10] ^= 1

		cases := []verifyCase{
			{name: "valid", secrets: []string{oldS}, h: valid, body: body},
			{name: "wrong secret", secrets: []string{newS}, h: valid, body: body, want: signature.ErrNoMatch},
			{name: "tampered body", secrets: []string{oldS}, h: valid, body: string(tampered), want: signature.ErrNoMatch},
			{name: "empty body", secrets: []string{oldS}, h: valid, body: "", want: signature.ErrNoMatch},
			{name: "missing header", secrets: []string{oldS}, body: body, want: signature.ErrMissingHeader,
				h: with(func(h http.Header) { h.Del(s.header) })},
			{name: "empty header", secrets: []string{oldS}, body: body, want: signature.ErrMissingHeader,
				h: with(func(h http.Header) { h.Set(s.header, "") })},
			{name: "repeated header", secrets: []string{oldS}, body: body, want: signature.ErrRepeatedHeader,
				h: with(func(h http.Header) { h.Add(s.header, h.Get(s.header)) })},
			{name: "no headers", secrets: []string{oldS}, h: http.Header{}, body: body, want: signature.ErrMissingHeader},
			{name: "rotation old secret", secrets: []string{oldS, newS}, h: s.deliver(oldS, nowTS, body), body: body},
			{name: "rotation new secret", secrets: []string{oldS, newS}, h: s.deliver(newS, nowTS, body), body: body},
			{name: "rotation third secret", secrets: []string{oldS, newS}, h: s.deliver(other, nowTS, body), body: body,
				want: signature.ErrNoMatch},
		}
		for i, m := range s.malformed {
			cases = append(cases, verifyCase{
				name: fmt.Sprintf("malformed %d %s", i, m.header), secrets: []string{oldS}, body: body,
				want: signature.ErrMalformedHeader,
				h:    with(func(h http.Header) { h.Set(m.header, m.value) }),
			})
		}
		if s.timed {
			tooNew := error(nil)
			if s.future {
				tooNew = signature.ErrTimestamp
			}
			signedAt := func(ts int64) http.Header { return s.deliver(oldS, ts, body) }
			cases = append(cases,
				verifyCase{name: "oldest allowed", secrets: []string{oldS}, h: signedAt(nowTS - tolSec), body: body},
				verifyCase{name: "old timestamp", secrets: []string{oldS}, h: signedAt(nowTS - tolSec - 1), body: body,
					want: signature.ErrTimestamp},
				verifyCase{name: "old by a fraction of a second", secrets: []string{oldS}, h: signedAt(nowTS - tolSec),
					body: body, now: now.Add(time.Millisecond), want: signature.ErrTimestamp},
				verifyCase{name: "zero timestamp", secrets: []string{oldS}, h: signedAt(0), body: body,
					want: signature.ErrTimestamp},
				verifyCase{name: "old timestamp checked before signature", secrets: []string{oldS},
					h: s.deliver(other, nowTS-tolSec-1, body), body: body, want: signature.ErrTimestamp},
				verifyCase{name: "newest allowed", secrets: []string{oldS}, h: signedAt(nowTS + tolSec), body: body},
				verifyCase{name: "future timestamp", secrets: []string{oldS}, h: signedAt(nowTS + tolSec + 1), body: body,
					want: tooNew},
				verifyCase{name: "far future timestamp", secrets: []string{oldS}, h: signedAt(nowTS + 10*365*86400),
					body: body, want: tooNew},
				verifyCase{name: "largest timestamp", secrets: []string{oldS}, h: signedAt(math.MaxInt64), body: body,
					want: tooNew},
				verifyCase{name: "largest timestamp, absurd past now", secrets: []string{oldS}, h: signedAt(math.MaxInt64),
					body: body, now: time.Unix(-1<<62, 999), want: tooNew},
				verifyCase{name: "zero timestamp, absurd future now", secrets: []string{oldS}, h: signedAt(0),
					body: body, now: time.Unix(1<<62, 999), want: signature.ErrTimestamp},
				verifyCase{name: "leading zeros", secrets: []string{oldS}, body: body,
					h: with(func(h http.Header) {
						for k, vs := range h {
							h[k] = []string{strings.Replace(vs[0], strconv.FormatInt(nowTS, 10), "00"+strconv.FormatInt(nowTS, 10), 1)}
						}
					})},
			)
		}
		runCases(t, s, cases)
	}
}

func TestVerifyStandardWebhooksHeaders(t *testing.T) {
	s := senders[2]
	oldS := s.secrets[0]
	valid := s.deliver(oldS, nowTS, body)
	with := func(f func(h http.Header)) http.Header {
		h := valid.Clone()
		f(h)
		return h
	}
	dotted := func() http.Header {
		// A genuine signature over an id with a full stop.
		sig := base64.StdEncoding.EncodeToString(mac256(standardKey(oldS), "msg.1", ".", strconv.FormatInt(nowTS, 10), ".", body))
		return with(func(h http.Header) {
			h.Set("webhook-id", "msg.1")
			h.Set("webhook-signature", "v1,"+sig)
		})
	}
	runCases(t, s, []verifyCase{
		{name: "missing id", secrets: []string{oldS}, body: body, want: signature.ErrMissingHeader,
			h: with(func(h http.Header) { h.Del("webhook-id") })},
		{name: "missing timestamp", secrets: []string{oldS}, body: body, want: signature.ErrMissingHeader,
			h: with(func(h http.Header) { h.Del("webhook-timestamp") })},
		{name: "repeated id", secrets: []string{oldS}, body: body, want: signature.ErrRepeatedHeader,
			h: with(func(h http.Header) { h.Add("webhook-id", "msg_other") })},
		{name: "repeated timestamp", secrets: []string{oldS}, body: body, want: signature.ErrRepeatedHeader,
			h: with(func(h http.Header) { h.Add("webhook-timestamp", "1") })},
		{name: "other id", secrets: []string{oldS}, body: body, want: signature.ErrNoMatch,
			h: with(func(h http.Header) { h.Set("webhook-id", "msg_forged") })},
		{name: "other timestamp", secrets: []string{oldS}, body: body, want: signature.ErrNoMatch,
			h: with(func(h http.Header) { h.Set("webhook-timestamp", strconv.FormatInt(nowTS-1, 10)) })},
		{name: "id with a full stop", secrets: []string{oldS}, body: body, want: signature.ErrMalformedHeader, h: dotted()},
		{name: "only other versions", secrets: []string{oldS}, body: body, want: signature.ErrNoMatch,
			h: with(func(h http.Header) { h.Set("webhook-signature", "v1a,"+b64+b64[:44]+" v2,"+b64) })},
		{name: "doubled spaces", secrets: []string{oldS}, body: body,
			h: with(func(h http.Header) { h.Set("webhook-signature", " v2,x  "+h.Get("webhook-signature")+" ") })},
	})
}

func TestVerifyStripeHeaderItems(t *testing.T) {
	s := senders[1]
	oldS := s.secrets[0]
	ts := strconv.FormatInt(nowTS, 10)
	good := s.candidate(oldS, nowTS, body)
	runCases(t, s, []verifyCase{
		{name: "items in any order", secrets: []string{oldS}, body: body,
			h: http.Header{"Stripe-Signature": {"v0=" + hex64 + ",v1=" + good + ",t=" + ts}}},
		{name: "unknown items ignored", secrets: []string{oldS}, body: body,
			h: http.Header{"Stripe-Signature": {"t=" + ts + ",v2=" + hex64 + ",x=y,v1=" + good}}},
		{name: "uppercase hex", secrets: []string{oldS}, body: body,
			h: http.Header{"Stripe-Signature": {"t=" + ts + ",v1=" + strings.ToUpper(good)}}},
		{name: "space makes an unknown key", secrets: []string{oldS}, body: body, want: signature.ErrNoMatch,
			h: http.Header{"Stripe-Signature": {"t=" + ts + ", v1=" + good}}},
		{name: "only v0", secrets: []string{oldS}, body: body, want: signature.ErrNoMatch,
			h: http.Header{"Stripe-Signature": {"t=" + ts + ",v0=" + good}}},
		{name: "other timestamp", secrets: []string{oldS}, body: body, want: signature.ErrNoMatch,
			h: http.Header{"Stripe-Signature": {"t=" + strconv.FormatInt(nowTS-1, 10) + ",v1=" + good}}},
	})
}

// Several signatures in one header: senders list the old and the new
// secret's while they roll one.
func TestVerifySeveralSignatures(t *testing.T) {
	for _, s := range senders[1:3] {
		oldS, other := s.secrets[0], s.secrets[2]
		good := s.candidate(oldS, nowTS, body)
		bad := s.candidate(other, nowTS, body)
		many := func(n, validAt int) []string {
			c := make([]string, n)
			for i := range c {
				c[i] = bad
			}
			if validAt >= 0 {
				c[validAt] = good
			}
			return c
		}
		runCases(t, s, []verifyCase{
			{name: "valid first", secrets: []string{oldS}, h: s.headers(nowTS, many(3, 0)...), body: body},
			{name: "valid last", secrets: []string{oldS}, h: s.headers(nowTS, many(3, 2)...), body: body},
			{name: "none valid", secrets: []string{oldS}, h: s.headers(nowTS, many(3, -1)...), body: body,
				want: signature.ErrNoMatch},
			{name: "rotation, header lists both", secrets: []string{s.secrets[1], oldS},
				h: s.headers(nowTS, s.candidate(s.secrets[1], nowTS, body), good), body: body},
			{name: "at the cap", secrets: []string{oldS}, body: body,
				h: s.headers(nowTS, many(signature.MaxSignatures, signature.MaxSignatures-1)...)},
			{name: "over the cap", secrets: []string{oldS}, body: body, want: signature.ErrMalformedHeader,
				h: s.headers(nowTS, many(signature.MaxSignatures+1, signature.MaxSignatures)...)},
			{name: "far over the cap", secrets: []string{oldS}, body: body, want: signature.ErrMalformedHeader,
				h: s.headers(nowTS, many(10000, 9999)...)},
		})
	}
}

func TestVerifyErrorText(t *testing.T) {
	s := senders[1]
	v := mustNew(t, s.preset, s.secrets[0])
	tests := []struct {
		name string
		h    http.Header
		want string
	}{
		{"missing", http.Header{}, "missing signature header Stripe-Signature"},
		{"stale", s.deliver(s.secrets[0], nowTS-tolSec-1, body), "signature timestamp outside the tolerance: signed more than 5m0s ago"},
		{"cap", s.headers(nowTS, slices.Repeat([]string{hex64}, 33)...), "malformed signature header Stripe-Signature: more than 32 v1 signatures"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := v.Verify(tc.h, []byte(body), now)
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	sw := senders[2]
	err := mustNew(t, sw.preset, sw.secrets[0]).Verify(sw.deliver(sw.secrets[0], nowTS+tolSec+1, body), []byte(body), now)
	if want := "signature timestamp outside the tolerance: signed more than 5m0s in the future"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %v", err, want)
	}
}
