package jcs

import (
	"fmt"
	"unicode/utf8"
)

// validate is the first pass: it refuses anything that is not one I-JSON
// value (duplicate names aside, which index finds), and counts the members
// of every non-empty object into s.members[:s.nObj], in the order the
// objects open.
//
// Counting needs room, and the room was sized from the document's length
// and colons before it was read: a valid document never needs more. A
// document that does is already known to be invalid; validate then stops
// counting and reads on only to say where it goes wrong.
func (s *state) validate() error {
	doc := s.doc
	counts := s.members
	objects := s.objects[:0]
	s.kinds.depth = 0
	s.nObj, s.nMem = 0, 0
	full := false

	i := skipSpace(doc, 0)
next:
	for {
		// A value starts at i.
		if i >= len(doc) {
			return errEnd(doc)
		}
		var err error
		switch c := doc[i]; {
		case c == '{' || c == '[':
			if s.kinds.depth >= MaxDepth {
				return fail(ErrTooDeep, i, fmt.Sprintf("more than %d levels", MaxDepth))
			}
			j := skipSpace(doc, i+1)
			if j < len(doc) && doc[j] == c+2 { // '{'+2 is '}', '['+2 is ']'
				i = j + 1
				break
			}
			s.kinds.push(c == '{')
			if c == '[' {
				i = j
				continue next
			}
			if !full && s.nObj < len(counts) && len(objects) < cap(objects) {
				counts[s.nObj].sub = 0
				objects = append(objects, frame{a: uint32(s.nObj)})
			} else {
				full = true
			}
			s.nObj++
			if i, err = s.member(j, objects, full); err != nil {
				return err
			}
			continue next
		case c == '"':
			i, err = scanString(doc, i)
		case c == '-' || isDigit(c):
			i, err = scanNumber(doc, i)
		case c == 't':
			i, err = scanLiteral(doc, i, "true")
		case c == 'f':
			i, err = scanLiteral(doc, i, "false")
		case c == 'n':
			i, err = scanLiteral(doc, i, "null")
		default:
			return fail(ErrInvalid, i, "invalid character "+quoteByte(c)+" looking for beginning of value")
		}
		if err != nil {
			return err
		}

		// A value ended at i: go on to the next one, closing what ends first.
		for {
			i = skipSpace(doc, i)
			if s.kinds.depth == 0 {
				if i < len(doc) {
					return fail(ErrInvalid, i, "invalid character "+quoteByte(doc[i])+" after top-level value")
				}
				if full || s.nMem > len(counts) {
					return fmt.Errorf("jcs: internal error: a valid document outgrew its scratch")
				}
				return nil
			}
			if i >= len(doc) {
				return errEnd(doc)
			}
			c := doc[i]
			if s.kinds.inObject() {
				switch c {
				case ',':
					if i, err = s.member(i+1, objects, full); err != nil {
						return err
					}
					continue next
				case '}':
					if !full {
						objects = objects[:len(objects)-1]
					}
					s.kinds.pop()
					i++
					continue
				}
				return fail(ErrInvalid, i, "invalid character "+quoteByte(c)+" after object member")
			}
			switch c {
			case ',':
				i = skipSpace(doc, i+1)
				continue next
			case ']':
				s.kinds.pop()
				i++
				continue
			}
			return fail(ErrInvalid, i, "invalid character "+quoteByte(c)+" after array element")
		}
	}
}

// member reads a member's name and colon from i (whitespace allowed before
// either), counts it, and returns where its value starts.
func (s *state) member(i int, objects []frame, full bool) (int, error) {
	doc := s.doc
	i = skipSpace(doc, i)
	if i >= len(doc) {
		return i, errEnd(doc)
	}
	if doc[i] != '"' {
		return i, fail(ErrInvalid, i, "invalid character "+quoteByte(doc[i])+" looking for beginning of object member name")
	}
	i, err := scanString(doc, i)
	if err != nil {
		return i, err
	}
	i = skipSpace(doc, i)
	if i >= len(doc) {
		return i, errEnd(doc)
	}
	if doc[i] != ':' {
		return i, fail(ErrInvalid, i, "invalid character "+quoteByte(doc[i])+" after object member name")
	}
	s.nMem++
	if !full {
		s.members[objects[len(objects)-1].a].sub++
	}
	return skipSpace(doc, i+1), nil
}

// scanString checks the string whose opening quote is at i and returns the
// offset after its closing quote.
func scanString(doc []byte, i int) (int, error) {
	i++
	for {
		for i < len(doc) && plainASCII[doc[i]] {
			i++
		}
		if i >= len(doc) {
			return i, errEnd(doc)
		}
		switch c := doc[i]; {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			var err error
			if i, err = scanEscape(doc, i); err != nil {
				return i, err
			}
		case c < ' ':
			return i, fail(ErrInvalid, i, "invalid character "+quoteByte(c)+" in string literal")
		default:
			r, n := utf8.DecodeRune(doc[i:])
			if r == utf8.RuneError && n <= 1 {
				return i, fail(ErrInvalid, i, "invalid UTF-8 in string")
			}
			i += n
		}
	}
}

// scanEscape checks the escape at i and returns the offset after it. A
// surrogate escape must be a high one followed at once by an escaped low
// one: I-JSON has no lone surrogates, and RFC 8785 could not write one.
func scanEscape(doc []byte, i int) (int, error) {
	if i+1 >= len(doc) {
		return i, errEnd(doc)
	}
	switch doc[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2, nil
	case 'u':
	default:
		return i, fail(ErrInvalid, i+1, "invalid character "+quoteByte(doc[i+1])+" in string escape code")
	}
	u, err := scanHex(doc, i)
	if err != nil {
		return i, err
	}
	switch {
	case u < 0xd800 || u > 0xdfff:
		return i + 6, nil
	case u >= 0xdc00:
		return i, fail(ErrInvalid, i, "lone low surrogate escape")
	}
	if i+7 >= len(doc) || doc[i+6] != '\\' || doc[i+7] != 'u' {
		return i, fail(ErrInvalid, i, "high surrogate escape without a low one")
	}
	lo, err := scanHex(doc, i+6)
	if err != nil {
		return i, err
	}
	if lo < 0xdc00 || lo > 0xdfff {
		return i, fail(ErrInvalid, i+6, "high surrogate escape without a low one")
	}
	return i + 12, nil
}

// scanHex reads the four hex digits of the \u escape at i.
func scanHex(doc []byte, i int) (rune, error) {
	var u rune
	for k := i + 2; k < i+6; k++ {
		if k >= len(doc) {
			return 0, errEnd(doc)
		}
		d := hexValue[doc[k]]
		if d < 0 {
			return 0, fail(ErrInvalid, k, "invalid character "+quoteByte(doc[k])+" in \\u hexadecimal character escape")
		}
		u = u<<4 | rune(d)
	}
	return u, nil
}

// scanNumber checks the number at i against RFC 8259's grammar and
// numberFitsDouble, and returns the offset after it.
func scanNumber(doc []byte, i int) (int, error) {
	start := i
	if doc[i] == '-' {
		i++
	}
	switch {
	case i >= len(doc):
		return i, errEnd(doc)
	case doc[i] == '0':
		i++
	case isDigit(doc[i]):
		i = skipDigits(doc, i)
	default:
		return i, fail(ErrInvalid, i, "invalid character "+quoteByte(doc[i])+" in numeric literal")
	}
	if i < len(doc) && doc[i] == '.' {
		i++
		if i >= len(doc) || !isDigit(doc[i]) {
			return i, errDigit(doc, i)
		}
		i = skipDigits(doc, i)
	}
	if i < len(doc) && (doc[i] == 'e' || doc[i] == 'E') {
		i++
		if i < len(doc) && (doc[i] == '+' || doc[i] == '-') {
			i++
		}
		if i >= len(doc) || !isDigit(doc[i]) {
			return i, errDigit(doc, i)
		}
		i = skipDigits(doc, i)
	}
	if !numberFitsDouble(doc[start:i]) {
		return i, fail(ErrImprecise, start, "more than 15 significant digits, or beyond 1e±300")
	}
	return i, nil
}

func scanLiteral(doc []byte, i int, lit string) (int, error) {
	for k := 0; k < len(lit); k++ {
		if i+k >= len(doc) {
			return i, errEnd(doc)
		}
		if doc[i+k] != lit[k] {
			return i, fail(ErrInvalid, i+k, "invalid character "+quoteByte(doc[i+k])+" in literal "+lit)
		}
	}
	return i + len(lit), nil
}

func errEnd(doc []byte) error { return fail(ErrInvalid, len(doc), "unexpected end of JSON input") }

func errDigit(doc []byte, i int) error {
	if i >= len(doc) {
		return errEnd(doc)
	}
	return fail(ErrInvalid, i, "invalid character "+quoteByte(doc[i])+" in numeric literal")
}

// quoteByte names a byte of the document for an error message: printable
// ASCII quoted, anything else in hex, so that no message carries raw input.
func quoteByte(c byte) string {
	if c >= ' ' && c < 0x7f {
		if c == '\'' || c == '\\' {
			return `'\` + string(c) + `'`
		}
		return "'" + string(c) + "'"
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(doc []byte, i int) int {
	for i < len(doc) && isSpace(doc[i]) {
		i++
	}
	return i
}

func skipDigits(doc []byte, i int) int {
	for i < len(doc) && isDigit(doc[i]) {
		i++
	}
	return i
}

// plainASCII is the bytes of a string that stand for themselves in every
// pass: ASCII from the space up, other than the quote and the backslash.
var plainASCII = func() (t [256]bool) {
	for c := ' '; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plain is the bytes emit copies from a string as they are: plainASCII and
// any byte of a multi-byte UTF-8 sequence (validate has checked those).
var plain = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = plainASCII[c] || c >= 0x80
	}
	return t
}()

var hexValue = func() (t [256]int8) {
	for c := range t {
		t[c] = -1
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = int8(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = int8(c - 'a' + 10)
		t[c-'a'+'A'] = int8(c - 'a' + 10)
	}
	return t
}()
