package proxy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/idemproxy/idemproxy/proxy/jsonpointer"
)

// KeySource is a parsed route option key=SOURCE: where an at-least-once
// sender's message id is found in the request, for senders that send no
// Idempotency-Key (webhooks, push subscriptions, CloudEvents).
type KeySource struct {
	Text      string      // as written: a preset's name, or the expression
	alts      [][]keyPart // alternatives ("|"), each a composite ("+")
	needsBody bool        // a json: part: the body is read before the key
	// bodyBound: the key also holds the SHA-256 of the body (BindBody).
	bodyBound bool
}

// BindBody returns a copy of ks whose keys also hold the SHA-256 of the
// request's body (hex), after the parts' values: a verify= route of a sender
// whose signature covers the body but not the message id (GitHub, Shopify).
// Otherwise whoever holds one signed delivery could send it again under the
// id of a delivery still to come, and that id's key would hold the old
// answer: the genuine delivery would get 422 (strict) or the old event's
// answer (none), and never execute. Bound, such a resend gets a key of its
// own. The body is read before the key.
func (ks *KeySource) BindBody() *KeySource {
	bound := *ks
	bound.bodyBound, bound.needsBody = true, true
	return &bound
}

// BodyBound reports whether ks's keys hold the body's SHA-256 (BindBody).
func (ks *KeySource) BodyBound() bool { return ks.bodyBound }

// signsBodyOnly are the presets whose senders sign the body but not the
// message id the key is read from (a header): with verify=, their keys are
// bound to the body.
var signsBodyOnly = map[string]bool{"github": true, "shopify": true}

type partKind uint8

const (
	partHeader partKind = iota
	partQuery
	partJSON
)

type keyPart struct {
	kind partKind
	name string              // canonical header name, or query parameter name
	ptr  jsonpointer.Pointer // json: where the value is
	text string              // the part as written, for messages
}

// keyPresets are the message ids of common senders.
var keyPresets = map[string]string{
	"github":            "header:X-GitHub-Delivery",
	"standard-webhooks": "header:webhook-id",
	"stripe-events":     "json:/id",
	"shopify":           "header:X-Shopify-Event-Id",
	"sns":               "header:x-amz-sns-message-id",
	"cloudevents":       "header:ce-source+header:ce-id|json:/source+json:/id",
}

// ParseKeySource parses a SOURCE: a preset name, or alternatives separated
// by "|", each one or more parts joined by "+"; a part is header:NAME,
// query:NAME or json:POINTER (RFC 6901).
func ParseKeySource(src string) (*KeySource, error) {
	expr := src
	if p, ok := keyPresets[src]; ok {
		expr = p
	}
	if expr == "" {
		return nil, errors.New("empty SOURCE (want header:NAME, query:NAME, json:/POINTER, parts joined by + and |, or a preset: github, standard-webhooks, stripe-events, shopify, sns, cloudevents)")
	}
	ks := &KeySource{Text: src}
	for alt := range strings.SplitSeq(expr, "|") {
		var parts []keyPart
		for text := range strings.SplitSeq(alt, "+") {
			kind, arg, ok := strings.Cut(text, ":")
			if !ok {
				if _, preset := keyPresets[text]; preset {
					return nil, fmt.Errorf("part %q: a preset is a whole SOURCE, not a part", text)
				}
				return nil, fmt.Errorf("part %q: want header:NAME, query:NAME or json:/POINTER (or a preset: github, standard-webhooks, stripe-events, shopify, sns, cloudevents)", text)
			}
			p := keyPart{text: text}
			switch kind {
			case "header":
				if !ValidHeaderName(arg) {
					return nil, fmt.Errorf("part %q: not a header name (RFC 9110 token characters only)", text)
				}
				p.kind, p.name = partHeader, textproto.CanonicalMIMEHeaderKey(arg)
				if p.name == "Host" {
					return nil, fmt.Errorf("part %q: the Host header is not a message id; key by a header the sender sets", text)
				}
			case "query":
				if arg == "" {
					return nil, fmt.Errorf("part %q: empty query parameter name", text)
				}
				p.kind, p.name = partQuery, arg
			case "json":
				if !strings.HasPrefix(arg, "/") {
					return nil, fmt.Errorf("part %q: a JSON pointer starts with / (RFC 6901), e.g. json:/id", text)
				}
				ptr, err := jsonpointer.Parse(arg)
				if err != nil {
					return nil, fmt.Errorf("part %q: %w", text, err)
				}
				p.kind, p.ptr = partJSON, ptr
				ks.needsBody = true
			default:
				return nil, fmt.Errorf("part %q: unknown kind %q (want header, query or json)", text, kind)
			}
			parts = append(parts, p)
		}
		for _, prev := range ks.alts {
			if _, preset := keyPresets[src]; !preset && len(prev) == len(parts) {
				// The key is the SOURCE and the values, not which
				// alternative gave them (so that the presets' alternatives,
				// two spellings of one id, make one key): two alternatives
				// of one length would make X-Order: 42 and X-Customer: 42
				// one key.
				return nil, fmt.Errorf("alternatives %s and %s both have %d part(s): a request matching one and a request matching the other with the same values would share a key; give each alternative a different number of parts, or use one route per id", altText(prev), altText(parts), len(parts))
			}
		}
		ks.alts = append(ks.alts, parts)
	}
	return ks, nil
}

// altText is an alternative as written.
func altText(parts []keyPart) string {
	texts := make([]string, len(parts))
	for i, p := range parts {
		texts[i] = p.text
	}
	return strings.Join(texts, "+")
}

// ValidHeaderName reports whether s is an RFC 9110 token: a header name a
// request can carry (and, by the same grammar, a method name).
func ValidHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// errPartInvalid: a part is present but unusable (empty, too long,
// repeated); the message names it.
type errPartInvalid struct{ msg string }

func (e *errPartInvalid) Error() string { return e.msg }

// derive returns the key for r: the SOURCE text and the values of the
// first alternative whose parts are all present, length-prefixed so that
// ("a","bc") and ("ab","c") differ. errNoKey when no alternative is
// complete; *errPartInvalid when the first complete one has a part present
// but unusable (empty, too long, repeated). An alternative with a part
// absent is passed over whatever its other parts hold, so that the order
// of the parts never decides whether a request is refused. body is the
// buffered request body (nil when the source reads none).
func (ks *KeySource) derive(r *http.Request, body []byte, maxLen int) (string, error) {
	bodyIsJSON := -1 // unknown yet
alternatives:
	for _, alt := range ks.alts {
		var vals [4]string
		values := vals[:0]
		var invalid *errPartInvalid // the first unusable part, told if all are present
		bad := func(format string, a ...any) {
			if invalid == nil {
				invalid = &errPartInvalid{fmt.Sprintf(format, a...)}
			}
		}
		for _, p := range alt {
			var v string
			switch p.kind {
			case partHeader:
				vv := r.Header[p.name]
				if len(vv) == 0 {
					continue alternatives
				}
				if len(vv) > 1 {
					bad("key part %s appears %d times; it must appear once", p.text, len(vv))
					continue
				}
				v = vv[0]
				if strings.HasPrefix(p.name, "Ce-") {
					// The CloudEvents HTTP binding percent-encodes ce-*
					// values; decoded, binary mode gives the id and source
					// that structured mode carries in its JSON.
					d, err := url.PathUnescape(v)
					if err != nil || !utf8.ValidString(d) {
						bad("key part %s is not a valid percent-encoded CloudEvents value", p.text)
						continue
					}
					v = d
				}
			case partQuery:
				n, val, err := queryParam(r.URL.RawQuery, p.name)
				switch {
				case n == 0 && err == nil:
					continue alternatives
				case err != nil:
					bad("key part %s: %v", p.text, err)
					continue
				case n > 1:
					bad("key part %s appears %d times; it must appear once", p.text, n)
					continue
				}
				v = val
			case partJSON:
				if bodyIsJSON < 0 {
					bodyIsJSON = 0
					if json.Valid(body) {
						bodyIsJSON = 1
					}
				}
				if bodyIsJSON == 0 {
					continue alternatives
				}
				raw, err := p.ptr.Find(body)
				if errors.Is(err, jsonpointer.ErrDuplicate) {
					// Parsers disagree on which of two members counts:
					// the upstream may act on the other one, so the
					// message has no one id, as for a repeated header.
					bad("key part %s: a member on its path appears more than once in the body", p.text)
					continue
				}
				if err == nil {
					v, err = jsonpointer.Text(raw)
				}
				if err != nil {
					// Missing, not a string or number, or a string that
					// held invalid UTF-8 or an unpaired surrogate (two
					// different ids would decode alike): no usable id.
					continue alternatives
				}
			}
			switch {
			case v == "":
				bad("key part %s is empty", p.text)
			case len(v) > maxLen:
				bad("key part %s is longer than %d bytes", p.text, maxLen)
			default:
				values = append(values, v)
			}
		}
		if invalid != nil {
			return "", invalid
		}
		if ks.bodyBound {
			sum := sha256.Sum256(body)
			values = append(values, hex.EncodeToString(sum[:]))
		}
		return ks.key(values), nil
	}
	if bodyIsJSON == 0 {
		return "", errNoKeyNotJSON
	}
	return "", errNoKey
}

// Key returns the key that a request whose parts have these values gets
// (what derive returns), for `idemproxy keys hash`: values are the parts of
// one alternative, in order, as the proxy reads them (a ce-* header
// percent-decoded), and, when ks is BodyBound, the body's SHA-256 in hex
// last. Their number must be the part count of an alternative (plus one).
func (ks *KeySource) Key(values []string) (string, error) {
	counts := make([]string, 0, len(ks.alts))
	extra := 0
	if ks.bodyBound {
		extra = 1
	}
	for _, alt := range ks.alts {
		if len(alt)+extra == len(values) {
			return ks.key(values), nil
		}
		counts = append(counts, fmt.Sprintf("%d (%s)", len(alt), altText(alt)))
	}
	return "", fmt.Errorf("key source %s takes %s values, not %d", ks.Text, strings.Join(counts, " or "), len(values))
}

// key is the SOURCE text and the values, each length-prefixed so that
// ("a","bc") and ("ab","c") differ.
func (ks *KeySource) key(values []string) string {
	var stack [512]byte
	b := binary.LittleEndian.AppendUint64(stack[:0], uint64(len(ks.Text)))
	b = append(b, ks.Text...)
	for _, v := range values {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(v)))
		b = append(b, v...)
	}
	return string(b)
}

// HeaderKey returns the key of a request whose IDEMPOTENCY_HEADER is value,
// as sent (a structured-field string is unquoted), or why the proxy refuses
// it; for `idemproxy keys hash`.
func HeaderKey(value string, maxLen int) (string, error) {
	return parseKey([]string{value}, maxLen)
}

// queryParam counts the occurrences of name in a raw query, splitting on
// "&" only (";" is data, as most upstreams read it), and returns the
// decoded value of the last one. A pair that does not decode is an error,
// never "absent": the upstream may well see that id.
func queryParam(raw, name string) (n int, value string, err error) {
	for pair := range strings.SplitSeq(raw, "&") {
		k, v, _ := strings.Cut(pair, "=")
		dk, kerr := url.QueryUnescape(k)
		if kerr != nil {
			dk = k // compared as written; it cannot be the name unless it is
		}
		if dk != name {
			continue
		}
		dv, verr := url.QueryUnescape(v)
		if verr != nil {
			return 0, "", fmt.Errorf("its value %q does not decode", v)
		}
		n, value = n+1, dv
	}
	return n, value, nil
}

// headers are the header names the key is taken from.
func (ks *KeySource) headers() []string {
	var names []string
	for _, alt := range ks.alts {
		for _, p := range alt {
			if p.kind == partHeader {
				names = append(names, p.name)
			}
		}
	}
	return names
}
