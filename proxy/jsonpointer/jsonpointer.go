// Package jsonpointer finds the value an RFC 6901 JSON Pointer names in a
// raw JSON document without decoding it.
//
// It runs on every first request of a route that takes its key from the
// body, so it builds no tree: a small scanner walks the bytes, descends only
// into the members and elements the pointer names and skips everything else.
// Find allocates nothing; Text allocates only the string it returns.
//
// Where JSON parsers disagree, it refuses rather than pick a side: a member
// named twice on the pointer's path is ErrDuplicate (encoding/json and
// JavaScript take the last, gjson, jsonparser and cJSON the first, so the
// upstream may act on another id than the key's), and a string whose
// decoding would replace something (invalid UTF-8, a lone surrogate) is no
// usable text (two different ids would decode alike).
package jsonpointer

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

var (
	// ErrNotFound: nothing is at the pointer (a member or element is
	// missing, or the path goes through a scalar).
	ErrNotFound = errors.New("jsonpointer: no value there")
	// ErrDuplicate: a member on the pointer's path appears more than once
	// in its object (names compared after unescaping).
	ErrDuplicate = errors.New("jsonpointer: a member on the path appears more than once")
	// ErrNotText: the value is not a string or a number.
	ErrNotText = errors.New("jsonpointer: not a string or a number")
	// ErrReplaced: a string holding invalid UTF-8 or an unpaired surrogate
	// escape, which a decoder would replace with U+FFFD.
	ErrReplaced = errors.New("jsonpointer: string holds invalid UTF-8 or an unpaired surrogate")
)

// Pointer is a parsed JSON Pointer: its unescaped reference tokens. The
// empty Pointer names the whole document.
type Pointer []string

// Parse splits an RFC 6901 JSON Pointer ("/a/b~1c/0") into its unescaped
// reference tokens (~1 -> /, ~0 -> ~). It fails on a pointer that is not
// empty and does not start with "/", and on a "~" not followed by 0 or 1.
// "" (the whole document) is allowed and returns no tokens.
func Parse(p string) (Pointer, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("JSON pointer %q must be empty or start with /", p)
	}
	tokens := make(Pointer, 0, strings.Count(p, "/"))
	rest := p[1:]
	for {
		tok, after, more := strings.Cut(rest, "/")
		if strings.IndexByte(tok, '~') >= 0 {
			var ok bool
			if tok, ok = unescapeToken(tok); !ok {
				return nil, fmt.Errorf("JSON pointer %q: a ~ must be followed by 0 (for ~) or 1 (for /)", p)
			}
		}
		tokens = append(tokens, tok)
		if !more {
			return tokens, nil
		}
		rest = after
	}
}

// String is the pointer in RFC 6901 form.
func (p Pointer) String() string {
	var b strings.Builder
	for _, tok := range p {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(tok))
	}
	return b.String()
}

// unescapeToken turns ~1 into / and ~0 into ~; any other ~ is an error.
func unescapeToken(tok string) (string, bool) {
	var b strings.Builder
	b.Grow(len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c != '~' {
			b.WriteByte(c)
			continue
		}
		if i+1 == len(tok) {
			return "", false
		}
		i++
		switch tok[i] {
		case '0':
			b.WriteByte('~')
		case '1':
			b.WriteByte('/')
		default:
			return "", false
		}
	}
	return b.String(), true
}

// Find returns the value p names in doc, a JSON document that json.Valid
// accepted (the caller checks): its bytes as written, a subslice of doc.
// Array tokens are decimal indexes without leading zeros ("0", "12"); "-"
// and anything else on an array find nothing. It returns ErrNotFound when
// nothing is there and ErrDuplicate when a member on the path appears twice
// in its object, wherever that is (a later member of the same name is
// looked for even after one matched).
//
// On a document that is not valid JSON it does not panic; what it returns
// then is unspecified.
func (p Pointer) Find(doc []byte) ([]byte, error) {
	i := skipSpace(doc, 0)
	if len(p) > 0 {
		var dup bool
		i, _, dup = walk(doc, i, p, false)
		if dup {
			return nil, ErrDuplicate
		}
	}
	if i < 0 || i >= len(doc) {
		return nil, ErrNotFound
	}
	end := skipValue(doc, i)
	if end < 0 {
		return nil, ErrNotFound
	}
	return doc[i:end], nil
}

// Text returns the text of a value Find returned, as a key: a string's
// value, unescaped, or a number's literal exactly as written ("1.50", "-0",
// "1e3"). It returns ErrNotText for an object, array, true, false or null,
// and ErrReplaced for a string whose decoding would replace something (a
// U+FFFD the sender wrote, raw or escaped, is an ordinary character).
func Text(v []byte) (string, error) {
	if len(v) == 0 {
		return "", ErrNotText
	}
	switch c := v[0]; {
	case c == '"':
		end, plain := scanString(v, 0)
		if end < 0 {
			return "", ErrNotText
		}
		raw := v[1 : end-1]
		if plain {
			return string(raw), nil
		}
		var buf [256]byte
		s, replaced := appendUnescaped(buf[:0], raw)
		if replaced {
			return "", ErrReplaced
		}
		return string(s), nil
	case c == '-' || '0' <= c && c <= '9':
		return string(v), nil
	}
	return "", ErrNotText
}

// walk follows tokens (at least one) into the object or array starting at
// doc[i]. It returns where the value they name starts (-1: nothing there),
// when needEnd the index just past the object or array (-1: not JSON), and
// whether a member on the path appears twice.
//
// It reads each byte once (the value found aside): a member that matches is
// walked into right away rather than skipped and come back to, and the scan
// of its object goes on past it to find a second member of that name.
// Without needEnd it stops at the element of an array that it wants. It
// recurses once per token, never deeper.
func walk(doc []byte, i int, tokens []string, needEnd bool) (at, end int, dup bool) {
	if i >= len(doc) {
		return -1, -1, false
	}
	tok, rest := tokens[0], tokens[1:]
	switch doc[i] {
	case '{':
		return member(doc, i, tok, rest)
	case '[':
		return element(doc, i, tok, rest, needEnd)
	default:
		return -1, skipValue(doc, i), false
	}
}

// value finds rest in the value starting at doc[i] (a member or element that
// the pointer goes through) and returns it with the index just past the
// value.
func value(doc []byte, i int, rest []string, needEnd bool) (at, end int, dup bool) {
	if len(rest) == 0 {
		if !needEnd {
			return i, i, false
		}
		return i, skipValue(doc, i), false
	}
	return walk(doc, i, rest, needEnd)
}

// member walks the object at doc[i] ('{'): the value at rest in its member
// named tok, and the index just past the object.
func member(doc []byte, i int, tok string, rest []string) (at, end int, dup bool) {
	at = -1
	matched := false
	i = skipSpace(doc, i+1)
	if i < len(doc) && doc[i] == '}' {
		return -1, i + 1, false
	}
	for {
		if i >= len(doc) || doc[i] != '"' {
			return -1, -1, false
		}
		end, plain := scanString(doc, i)
		if end < 0 {
			return -1, -1, false
		}
		raw := doc[i+1 : end-1]
		var match bool
		if plain {
			match = string(raw) == tok
		} else {
			match = unescapedEqual(raw, tok)
		}
		i = skipSpace(doc, end)
		if i >= len(doc) || doc[i] != ':' {
			return -1, -1, false
		}
		i = skipSpace(doc, i+1)
		switch {
		case match && matched:
			return -1, -1, true
		case match:
			matched = true
			// The scan goes on, to find a second member of this name, and
			// needs where this value ends.
			var d bool
			if at, i, d = value(doc, i, rest, true); d {
				return -1, -1, true
			}
		default:
			i = skipValue(doc, i)
		}
		var done bool
		if i, done = next(doc, i, '}'); done {
			if i < 0 {
				return -1, -1, false
			}
			return at, i, false
		}
	}
}

// next goes on after a member's or element's value that ends at i: to the
// next one (its index, false), or past the container's closing byte (the
// index after it, true); (-1, true) when the document is malformed there.
func next(doc []byte, i int, closing byte) (int, bool) {
	if i < 0 {
		return -1, true
	}
	i = skipSpace(doc, i)
	switch {
	case i >= len(doc):
		return -1, true
	case doc[i] == ',':
		return skipSpace(doc, i+1), false
	case doc[i] == closing:
		return i + 1, true
	}
	return -1, true
}

// element walks the array at doc[i] ('['): the value at rest in its element
// tok (a decimal index), and, when needEnd, the index just past the array.
func element(doc []byte, i int, tok string, rest []string, needEnd bool) (at, end int, dup bool) {
	n := index(tok, len(doc))
	if n < 0 {
		if !needEnd {
			return -1, -1, false
		}
		return -1, skipContainer(doc, i), false
	}
	at = -1
	i = skipSpace(doc, i+1)
	if i < len(doc) && doc[i] == ']' {
		return -1, i + 1, false
	}
	for k := 0; ; k++ {
		if i >= len(doc) {
			return -1, -1, false
		}
		if k == n {
			var d bool
			if at, i, d = value(doc, i, rest, needEnd); d || !needEnd {
				return at, -1, d
			}
		} else {
			i = skipValue(doc, i)
		}
		var done bool
		if i, done = next(doc, i, ']'); done {
			if i < 0 {
				return -1, -1, false
			}
			return at, i, false
		}
	}
}

// index parses an array index: "0" or digits without a leading zero. It
// returns -1 for anything else and for an index that cannot exist in a
// document of docLen bytes (so it never overflows).
func index(tok string, docLen int) int {
	if tok == "" || tok[0] == '0' && len(tok) > 1 {
		return -1
	}
	n := 0
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
		if n > docLen {
			return -1
		}
	}
	return n
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(doc []byte, i int) int {
	for i < len(doc) {
		switch doc[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// scanString returns the index just past the closing quote of the string
// whose opening quote is doc[i] (or -1), and whether its raw bytes are its
// value: no escape and only ASCII.
func scanString(doc []byte, i int) (end int, plain bool) {
	plain = true
	for j := i + 1; j < len(doc); j++ {
		switch c := doc[j]; {
		case c == '"':
			return j + 1, plain
		case c == '\\':
			plain = false
			j++
		case c >= utf8.RuneSelf:
			plain = false
		}
	}
	return -1, false
}

// skipString returns the index just past the closing quote of the string
// whose opening quote is doc[i], or -1.
func skipString(doc []byte, i int) int {
	for j := i + 1; j < len(doc); j++ {
		switch doc[j] {
		case '"':
			return j + 1
		case '\\':
			j++
		}
	}
	return -1
}

// skipNumber returns the index just past the number starting at doc[i].
func skipNumber(doc []byte, i int) int {
	for i++; i < len(doc); i++ {
		switch c := doc[i]; {
		case '0' <= c && c <= '9', c == '.', c == 'e', c == 'E', c == '+', c == '-':
		default:
			return i
		}
	}
	return i
}

// skipValue returns the index just past the value starting at doc[i], or -1.
func skipValue(doc []byte, i int) int {
	if i >= len(doc) {
		return -1
	}
	switch c := doc[i]; c {
	case '"':
		return skipString(doc, i)
	case '{', '[':
		return skipContainer(doc, i)
	case 't', 'n':
		return skipLiteral(doc, i, 4)
	case 'f':
		return skipLiteral(doc, i, 5)
	default:
		if c == '-' || '0' <= c && c <= '9' {
			return skipNumber(doc, i)
		}
		return -1
	}
}

func skipLiteral(doc []byte, i, n int) int {
	if i+n > len(doc) {
		return -1
	}
	return i + n
}

// skipContainer returns the index just past the object or array starting at
// doc[i]. It counts brackets, skipping strings; it does not recurse, so deep
// nesting costs no stack.
func skipContainer(doc []byte, i int) int {
	depth := 0
	for i < len(doc) {
		switch doc[i] {
		case '"':
			if i = skipString(doc, i); i < 0 {
				return -1
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
		i++
	}
	return -1
}

// unescapedEqual reports whether the raw (escaped) string body raw decodes
// to tok. Names up to 128 bytes decode on the stack. A name whose decoding
// replaced something matches a token holding U+FFFD there, as encoding/json
// would decode it: names are compared, not used as keys.
func unescapedEqual(raw []byte, tok string) bool {
	var buf [128]byte
	s, _ := appendUnescaped(buf[:0], raw)
	return string(s) == tok
}

// appendUnescaped appends the value of the raw string body raw (the bytes
// between the quotes) to dst, decoding it as encoding/json does: escapes
// resolved, a \u surrogate pair joined, a lone surrogate and each byte of
// invalid UTF-8 replaced by U+FFFD. replaced reports whether any such
// replacement was made.
func appendUnescaped(dst, raw []byte) (_ []byte, replaced bool) {
	for r := 0; r < len(raw); {
		c := raw[r]
		switch {
		case c == '\\':
			if r+1 >= len(raw) {
				return dst, replaced
			}
			switch e := raw[r+1]; e {
			case '"', '\\', '/', '\'':
				dst = append(dst, e)
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				rr := hex4(raw[r:])
				if rr < 0 {
					return dst, replaced
				}
				r += 6
				if utf16.IsSurrogate(rr) {
					if dec := utf16.DecodeRune(rr, hex4(raw[r:])); dec != utf8.RuneError {
						dst = utf8.AppendRune(dst, dec)
						r += 6
						continue
					}
					rr, replaced = utf8.RuneError, true
				}
				dst = utf8.AppendRune(dst, rr)
				continue
			default:
				return dst, replaced
			}
			r += 2
		case c < utf8.RuneSelf:
			// Copy the run of plain ASCII up to the next escape or
			// non-ASCII byte in one append.
			j := r + 1
			for j < len(raw) && raw[j] != '\\' && raw[j] < utf8.RuneSelf {
				j++
			}
			dst = append(dst, raw[r:j]...)
			r = j
		default:
			rr, size := utf8.DecodeRune(raw[r:])
			if rr == utf8.RuneError && size == 1 {
				dst, replaced = utf8.AppendRune(dst, utf8.RuneError), true
			} else {
				dst = append(dst, raw[r:r+size]...)
			}
			r += size
		}
	}
	return dst, replaced
}

// hex4 decodes the escape \uXXXX at the start of s, or returns -1.
func hex4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}
