package proxy

import (
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// RFC 6901 JSON Pointer extraction on a raw JSON document. It runs on every
// first request of a route that takes its key from the body, so it does not
// build a tree: a small scanner walks the bytes, descends only into the
// members and elements the pointer names and skips everything else. It
// allocates only the returned string (and nothing when the pointer misses).

// parsePointer splits an RFC 6901 JSON Pointer ("/a/b~1c/0") into its
// unescaped reference tokens (~1 -> /, ~0 -> ~). It fails on a pointer that is
// not empty and does not start with "/", and on a "~" not followed by 0 or 1.
// "" (the whole document) is allowed and returns no tokens.
func parsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("JSON pointer %q must be empty or start with /", p)
	}
	tokens := make([]string, 0, strings.Count(p, "/"))
	rest := p[1:]
	for {
		tok, after, more := strings.Cut(rest, "/")
		if strings.IndexByte(tok, '~') >= 0 {
			var ok bool
			if tok, ok = unescapePointerToken(tok); !ok {
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

// unescapePointerToken turns ~1 into / and ~0 into ~; any other ~ is an error.
func unescapePointerToken(tok string) (string, bool) {
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

// jsonPointerValue returns the value at tokens in doc, a JSON document that
// json.Valid accepted (the caller checks): a string member's value, unescaped
// (as encoding/json would decode it, invalid UTF-8/lone surrogates replaced by
// U+FFFD), or a number's literal text exactly as written ("1.50", "-0", "1e3").
// Anything else there (object, array, true/false/null) or nothing there gives
// ok=false. Array tokens: decimal index without leading zeros ("0", "12");
// "-" and anything else on an array give ok=false. On an object with duplicate
// member names the LAST one wins (as encoding/json and JavaScript do).
//
// On a document that is not valid JSON it does not panic; what it returns
// then is unspecified.
func jsonPointerValue(doc []byte, tokens []string) (value string, ok bool) {
	i := jpSkipSpace(doc, 0)
	if len(tokens) > 0 {
		i, _ = jpWalk(doc, i, tokens, false)
	}
	if i < 0 || i >= len(doc) {
		return "", false
	}
	switch c := doc[i]; {
	case c == '"':
		end, plain := jpScanString(doc, i)
		if end < 0 {
			return "", false
		}
		raw := doc[i+1 : end-1]
		if plain {
			return string(raw), true
		}
		var buf [256]byte
		return string(jpAppendUnescaped(buf[:0], raw)), true
	case c == '-' || '0' <= c && c <= '9':
		return string(doc[i:jpSkipNumber(doc, i)]), true
	}
	return "", false
}

// jpWalk follows tokens (at least one) into the object or array starting at
// doc[i]. It returns where the value they name starts (-1: nothing there) and,
// when needEnd, the index just past the object or array (-1: not JSON).
//
// It reads each byte once (the value found aside): a member that matches is walked into right away
// rather than skipped and come back to, and the scan goes on past it because a
// later member of the same name wins. Without needEnd it stops at the element
// of an array that it wants. It recurses once per token, never deeper.
func jpWalk(doc []byte, i int, tokens []string, needEnd bool) (at, end int) {
	if i >= len(doc) {
		return -1, -1
	}
	tok, rest := tokens[0], tokens[1:]
	switch doc[i] {
	case '{':
		return jpMember(doc, i, tok, rest)
	case '[':
		return jpElement(doc, i, tok, rest, needEnd)
	default:
		return -1, jpSkipValue(doc, i)
	}
}

// jpValue finds rest in the value starting at doc[i] (a member or element
// that the pointer goes through) and returns it with the index just past the
// value.
func jpValue(doc []byte, i int, rest []string, needEnd bool) (at, end int) {
	if len(rest) == 0 {
		if !needEnd {
			return i, i
		}
		return i, jpSkipValue(doc, i)
	}
	return jpWalk(doc, i, rest, needEnd)
}

// jpMember walks the object at doc[i] ('{'): the value at rest in its last
// member named tok, and the index just past the object.
func jpMember(doc []byte, i int, tok string, rest []string) (at, end int) {
	at = -1
	i = jpSkipSpace(doc, i+1)
	if i < len(doc) && doc[i] == '}' {
		return -1, i + 1
	}
	for {
		if i >= len(doc) || doc[i] != '"' {
			return -1, -1
		}
		end, plain := jpScanString(doc, i)
		if end < 0 {
			return -1, -1
		}
		raw := doc[i+1 : end-1]
		var match bool
		if plain {
			match = string(raw) == tok
		} else {
			match = jpUnescapedEqual(raw, tok)
		}
		i = jpSkipSpace(doc, end)
		if i >= len(doc) || doc[i] != ':' {
			return -1, -1
		}
		i = jpSkipSpace(doc, i+1)
		if match {
			// A later member of the same name replaces this one, so
			// the scan goes on and needs where this value ends.
			at, i = jpValue(doc, i, rest, true)
		} else {
			i = jpSkipValue(doc, i)
		}
		var done bool
		if i, done = jpNext(doc, i, '}'); done {
			if i < 0 {
				return -1, -1
			}
			return at, i
		}
	}
}

// jpNext goes on after a member's or element's value that ends at i: to the
// next one (its index, false), or past the container's closing byte (the
// index after it, true); (-1, true) when the document is malformed there.
func jpNext(doc []byte, i int, closing byte) (int, bool) {
	if i < 0 {
		return -1, true
	}
	i = jpSkipSpace(doc, i)
	switch {
	case i >= len(doc):
		return -1, true
	case doc[i] == ',':
		return jpSkipSpace(doc, i+1), false
	case doc[i] == closing:
		return i + 1, true
	}
	return -1, true
}

// jpElement walks the array at doc[i] ('['): the value at rest in its element
// tok (a decimal index), and, when needEnd, the index just past the array.
func jpElement(doc []byte, i int, tok string, rest []string, needEnd bool) (at, end int) {
	n := jpIndex(tok, len(doc))
	if n < 0 {
		if !needEnd {
			return -1, -1
		}
		return -1, jpSkipContainer(doc, i)
	}
	at = -1
	i = jpSkipSpace(doc, i+1)
	if i < len(doc) && doc[i] == ']' {
		return -1, i + 1
	}
	for k := 0; ; k++ {
		if i >= len(doc) {
			return -1, -1
		}
		if k == n {
			if at, i = jpValue(doc, i, rest, needEnd); !needEnd {
				return at, -1
			}
		} else {
			i = jpSkipValue(doc, i)
		}
		var done bool
		if i, done = jpNext(doc, i, ']'); done {
			if i < 0 {
				return -1, -1
			}
			return at, i
		}
	}
}

// jpIndex parses an array index: "0" or digits without a leading zero. It
// returns -1 for anything else and for an index that cannot exist in a
// document of docLen bytes (so it never overflows).
func jpIndex(tok string, docLen int) int {
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

// jpSkipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func jpSkipSpace(doc []byte, i int) int {
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

// jpScanString returns the index just past the closing quote of the string
// whose opening quote is doc[i] (or -1), and whether its raw bytes are its
// value: no escape and only ASCII.
func jpScanString(doc []byte, i int) (end int, plain bool) {
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

// jpSkipString returns the index just past the closing quote of the string
// whose opening quote is doc[i], or -1.
func jpSkipString(doc []byte, i int) int {
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

// jpSkipNumber returns the index just past the number starting at doc[i].
func jpSkipNumber(doc []byte, i int) int {
	for i++; i < len(doc); i++ {
		switch c := doc[i]; {
		case '0' <= c && c <= '9', c == '.', c == 'e', c == 'E', c == '+', c == '-':
		default:
			return i
		}
	}
	return i
}

// jpSkipValue returns the index just past the value starting at doc[i], or -1.
func jpSkipValue(doc []byte, i int) int {
	if i >= len(doc) {
		return -1
	}
	switch c := doc[i]; c {
	case '"':
		return jpSkipString(doc, i)
	case '{', '[':
		return jpSkipContainer(doc, i)
	case 't', 'n':
		return jpSkipLiteral(doc, i, 4)
	case 'f':
		return jpSkipLiteral(doc, i, 5)
	default:
		if c == '-' || '0' <= c && c <= '9' {
			return jpSkipNumber(doc, i)
		}
		return -1
	}
}

func jpSkipLiteral(doc []byte, i, n int) int {
	if i+n > len(doc) {
		return -1
	}
	return i + n
}

// jpSkipContainer returns the index just past the object or array starting at
// doc[i]. It counts brackets, skipping strings; it does not recurse, so deep
// nesting costs no stack.
func jpSkipContainer(doc []byte, i int) int {
	depth := 0
	for i < len(doc) {
		switch doc[i] {
		case '"':
			if i = jpSkipString(doc, i); i < 0 {
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

// jpUnescapedEqual reports whether the raw (escaped) string body raw decodes
// to tok. Names up to 128 bytes decode on the stack.
func jpUnescapedEqual(raw []byte, tok string) bool {
	var buf [128]byte
	return string(jpAppendUnescaped(buf[:0], raw)) == tok
}

// jpAppendUnescaped appends the value of the raw string body raw (the bytes
// between the quotes) to dst, decoding it as encoding/json does: escapes
// resolved, a \u surrogate pair joined, a lone surrogate and each byte of
// invalid UTF-8 replaced by U+FFFD.
func jpAppendUnescaped(dst, raw []byte) []byte {
	for r := 0; r < len(raw); {
		c := raw[r]
		switch {
		case c == '\\':
			if r+1 >= len(raw) {
				return dst
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
				rr := jpHex4(raw[r:])
				if rr < 0 {
					return dst
				}
				r += 6
				if utf16.IsSurrogate(rr) {
					if dec := utf16.DecodeRune(rr, jpHex4(raw[r:])); dec != utf8.RuneError {
						dst = utf8.AppendRune(dst, dec)
						r += 6
						continue
					}
					rr = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, rr)
				continue
			default:
				return dst
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
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, raw[r:r+size]...)
			}
			r += size
		}
	}
	return dst
}

// jpHex4 decodes the escape \uXXXX at the start of s, or returns -1.
func jpHex4(s []byte) rune {
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
