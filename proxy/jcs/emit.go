package jcs

import (
	"unicode/utf16"
	"unicode/utf8"
)

// emit is the third pass: it writes the canonical form of a document that
// validate and index accepted. Arrays are written as they come; an object
// is written through its block, member by member in sorted order, each
// value re-read from the document where the member's name says.
//
// cur is where the blocks of the objects in the value being written start.
// Once a value is written, cur is past the blocks of all the objects in it,
// which is where the blocks of its next array element start. For an
// object's member values, written out of document order, cur comes from
// each member's sub instead, and the object as a whole ends where its last
// member in document order (the furthest one) ends.
func (s *state) emit() {
	doc := s.doc
	members := s.members[:s.nMem]
	objects := s.objects[:0]
	o := &s.out
	cur := uint32(0)

	i := skipSpace(doc, 0)
value:
	for o.err == nil {
		switch c := doc[i]; c {
		case '{', '[':
			j := skipSpace(doc, i+1)
			if doc[j] == c+2 {
				o.two(c, c+2)
				i = j + 1
				break
			}
			o.byte(c)
			s.kinds.push(c == '{')
			if c == '[' {
				i = j
				continue value
			}
			objects = append(objects, frame{a: cur, b: blockEnd(members, cur)})
			i, cur = s.startMember(cur, member{})
			continue value
		case '"':
			i = s.emitString(i)
		case 't':
			o.bytes(litTrue)
			i += len(litTrue)
		case 'f':
			o.bytes(litFalse)
			i += len(litFalse)
		case 'n':
			o.bytes(litNull)
			i += len(litNull)
		default:
			j := skipNumber(doc, i)
			o.room(32)
			o.b = appendNumber(o.b, doc[i:j])
			i = j
		}

		// A value ended at i.
		for s.kinds.depth > 0 {
			if !s.kinds.inObject() {
				i = skipSpace(doc, i)
				if doc[i] == ',' {
					o.byte(',')
					i = skipSpace(doc, i+1)
					continue value
				}
				o.byte(']')
				s.kinds.pop()
				i++
				continue
			}
			// The slot of the member just written keeps the furthest end
			// and cursor so far, and hands them on to the next slot.
			f := &objects[len(objects)-1]
			far := &members[f.a]
			far.name = max(far.name, uint32(i))
			far.sub = max(far.sub, cur)
			if f.a+1 < f.b {
				f.a++
				o.byte(',')
				i, cur = s.startMember(f.a, *far)
				continue value
			}
			o.byte('}')
			i = skipSpace(doc, int(far.name)) + 1
			cur = far.sub
			objects = objects[:len(objects)-1]
			s.kinds.pop()
		}
		return
	}
}

// startMember writes the name and colon of the member in slot k, leaves
// far in the slot, and returns where the member's value starts and its
// cursor.
func (s *state) startMember(k uint32, far member) (int, uint32) {
	m := s.members[k]
	s.members[k] = far
	i := s.emitString(int(m.name))
	s.out.byte(':')
	i = skipSpace(s.doc, i)
	return skipSpace(s.doc, i+1), m.sub
}

// blockEnd is the end of the block that starts at k. A block's length is
// not stored: its first member in document order has the least sub, and
// that sub is where the block ends, since the blocks inside that member's
// value come right after it.
func blockEnd(members []member, k uint32) uint32 {
	end := ^uint32(0)
	for ; k < end && int(k) < len(members); k++ {
		end = min(end, members[k].sub)
	}
	return end
}

var (
	litTrue  = []byte("true")
	litFalse = []byte("false")
	litNull  = []byte("null")
)

// emitString writes the string whose opening quote is at i in canonical
// form (RFC 8785 section 3.2.2.2) and returns the offset after it: escapes
// are decoded, and only the quote, the backslash and control characters
// are escaped again.
func (s *state) emitString(i int) int {
	doc := s.doc
	run := i // start of what stands as written, the opening quote first
	i++
	for {
		for plain[doc[i]] {
			i++
		}
		if doc[i] == '"' {
			s.out.bytes(doc[run : i+1])
			return i + 1
		}
		s.out.bytes(doc[run:i])
		i = s.emitEscape(i)
		run = i
	}
}

// emitEscape writes the character of the escape at i and returns the
// offset after it (after both escapes of a surrogate pair).
func (s *state) emitEscape(i int) int {
	doc := s.doc
	e := doc[i+1]
	if e != 'u' {
		// The short escapes other than \/ are already canonical.
		if e == '/' {
			s.out.byte('/')
		} else {
			s.out.two('\\', e)
		}
		return i + 2
	}
	r := hex4(doc[i+2:])
	i += 6
	if utf16.IsSurrogate(r) {
		r = utf16.DecodeRune(r, hex4(doc[i+2:]))
		i += 6
	}
	s.out.rune(r)
	return i
}

func (o *sink) rune(r rune) {
	switch {
	case r == '"' || r == '\\':
		o.two('\\', byte(r))
	case r < ' ':
		if e := shortEscape[r]; e != 0 {
			o.two('\\', e)
			return
		}
		o.room(6)
		o.b = append(o.b, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&15])
	default:
		o.room(utf8.UTFMax)
		o.b = utf8.AppendRune(o.b, r)
	}
}

var shortEscape = [' ']byte{'\b': 'b', '\t': 't', '\n': 'n', '\f': 'f', '\r': 'r'}

const hexDigits = "0123456789abcdef"
