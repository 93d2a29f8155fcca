package proxy

import (
	"errors"
	"fmt"
	"strings"
)

var errNoKey = errors.New("no key")

// errNoKeyNotJSON: no alternative of a key=SOURCE was complete, and one
// needed a json: part from a body that is not JSON (a byte-order mark,
// gzip, a form): counted and warned of, since every such delivery runs
// without protection.
var errNoKeyNotJSON = fmt.Errorf("%w: the body is not JSON", errNoKey)

// parseKey extracts the idempotency key from the header's values. A value in
// IETF structured-field string form ("abc", with \" and \\ escapes) is
// unquoted; a bare token (as Stripe's clients send) is taken as it is. The
// key must be 1..maxLen visible ASCII characters. A repeated header, or a
// comma (which would make it a list), is rejected: the two requests it could
// mean must not share one record.
func parseKey(values []string, maxLen int) (string, error) {
	switch len(values) {
	case 0:
		return "", errNoKey
	case 1:
	default:
		return "", fmt.Errorf("the header appears %d times; send it once", len(values))
	}
	v := strings.TrimSpace(values[0])
	if strings.IndexByte(v, ',') >= 0 {
		return "", errors.New("the value holds a comma; send one key")
	}
	if strings.HasPrefix(v, `"`) {
		var err error
		if v, err = unquoteSFString(v); err != nil {
			return "", err
		}
	}
	if v == "" {
		return "", errors.New("the key is empty")
	}
	if len(v) > maxLen {
		return "", fmt.Errorf("the key is %d characters long; the limit is %d", len(v), maxLen)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("the key holds a character outside visible ASCII at position %d", i+1)
		}
	}
	return v, nil
}

// unquoteSFString decodes an RFC 8941 sf-string: DQUOTE *chr DQUOTE, where a
// backslash may only escape DQUOTE or backslash.
func unquoteSFString(v string) (string, error) {
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", errors.New("the quoted key has no closing quote")
	}
	in := v[1 : len(v)-1]
	if strings.IndexByte(in, '\\') < 0 {
		if strings.IndexByte(in, '"') >= 0 {
			return "", errors.New("the quoted key holds an unescaped quote")
		}
		return in, nil
	}
	var b strings.Builder
	b.Grow(len(in))
	for i := 0; i < len(in); i++ {
		switch c := in[i]; c {
		case '\\':
			i++
			if i == len(in) || (in[i] != '"' && in[i] != '\\') {
				return "", errors.New(`the quoted key has a backslash that escapes neither " nor \`)
			}
			b.WriteByte(in[i])
		case '"':
			return "", errors.New("the quoted key holds an unescaped quote")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}
