package jcs

import (
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// index is the second pass, over a document validate accepted. Each
// non-empty object gets a block of s.members, in the order the objects
// open: the block of an object is followed by the blocks of the objects in
// its first member's value, then in its second's, and so on. A member's sub
// is where the blocks of its value start, which lets emit, writing members
// in sorted order, find the objects inside each value. Each block is sorted
// as its object closes, and its names checked for duplicates.
func (s *state) index() error {
	doc := s.doc
	members := s.members[:s.nMem]
	counts := members[s.nMem-s.nObj:] // see run: read ahead of the filling
	objects := s.objects[:0]
	next := uint32(0) // first slot not yet in a block
	opened := 0       // non-empty objects opened so far

	i := skipSpace(doc, 0)
value:
	for {
		switch c := doc[i]; c {
		case '{', '[':
			j := skipSpace(doc, i+1)
			if doc[j] == c+2 {
				i = j + 1
				break
			}
			s.kinds.push(c == '{')
			if c == '[' {
				i = j
				continue value
			}
			n := counts[opened].sub
			opened++
			objects = append(objects, frame{a: next, b: next})
			next += n
			i = s.record(j, &objects[len(objects)-1], next)
			continue value
		case '"':
			i = skipString(doc, i)
		case 't', 'n':
			i += 4
		case 'f':
			i += 5
		default:
			i = skipNumber(doc, i)
		}

		// A value ended at i.
		for s.kinds.depth > 0 {
			i = skipSpace(doc, i)
			if s.kinds.inObject() {
				f := &objects[len(objects)-1]
				if doc[i] == ',' {
					i = s.record(i+1, f, next)
					continue value
				}
				if err := sortBlock(doc, members[f.a:f.b]); err != nil {
					return err
				}
				objects = objects[:len(objects)-1]
			} else if doc[i] == ',' {
				i = skipSpace(doc, i+1)
				continue value
			}
			s.kinds.pop()
			i++
		}
		return nil
	}
}

// record puts the member whose name follows i (after whitespace) in the
// next slot of its object's block, and returns where its value starts.
func (s *state) record(i int, f *frame, next uint32) int {
	doc := s.doc
	i = skipSpace(doc, i)
	s.members[f.b] = member{name: uint32(i), sub: next}
	f.b++
	i = skipSpace(doc, skipString(doc, i))
	return skipSpace(doc, i+1) // past the colon
}

// sortBlock orders an object's members by name, as RFC 8785 section 3.2.3
// orders them, and refuses two of one name.
func sortBlock(doc []byte, block []member) error {
	slices.SortFunc(block, func(x, y member) int {
		return compareNames(doc, int(x.name), int(y.name))
	})
	for k := 1; k < len(block); k++ {
		if compareNames(doc, int(block[k-1].name), int(block[k].name)) == 0 {
			return fail(ErrDuplicate, int(max(block[k-1].name, block[k].name)), "a name seen earlier in the same object")
		}
	}
	return nil
}

// compareNames compares the names whose opening quotes are at x and y as
// RFC 8785 wants them compared: as sequences of UTF-16 code units, after
// unescaping. Names are decoded as they are compared, a unit at a time, so
// that comparing allocates nothing.
func compareNames(doc []byte, x, y int) int {
	x++
	y++
	// Most names are ASCII without escapes, and compare as bytes.
	for doc[x] == doc[y] && plainASCII[doc[x]] {
		x++
		y++
	}
	if a, b := doc[x], doc[y]; plainASCII[a] && plainASCII[b] {
		return int(a) - int(b)
	}
	p, q := units{doc: doc, i: x}, units{doc: doc, i: y}
	for {
		a, b := p.next(), q.next()
		if a != b || a < 0 {
			return a - b
		}
	}
}

// units reads a string's UTF-16 code units from its escapes and UTF-8.
type units struct {
	doc []byte
	i   int
	low int // the second half of a surrogate pair still to come, or 0
}

// next returns the string's next code unit, or -1 at its end.
func (u *units) next() int {
	if u.low != 0 {
		c := u.low
		u.low = 0
		return c
	}
	c := u.doc[u.i]
	switch {
	case c == '"':
		return -1
	case c == '\\':
		e := u.doc[u.i+1]
		if e == 'u' {
			// A surrogate escape is already a UTF-16 code unit.
			r := hex4(u.doc[u.i+2:])
			u.i += 6
			return int(r)
		}
		u.i += 2
		return int(unescape[e])
	case c < utf8.RuneSelf:
		u.i++
		return int(c)
	}
	r, n := utf8.DecodeRune(u.doc[u.i:])
	u.i += n
	if r >= 0x10000 {
		hi, lo := utf16.EncodeRune(r)
		u.low = int(lo)
		return int(hi)
	}
	return int(r)
}

// unescape is the character each short escape stands for.
var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// hex4 decodes four hex digits that validate has checked.
func hex4(p []byte) rune {
	return rune(hexValue[p[0]])<<12 | rune(hexValue[p[1]])<<8 | rune(hexValue[p[2]])<<4 | rune(hexValue[p[3]])
}

// skipString returns the offset after the string whose opening quote is at
// i, which validate has checked.
func skipString(doc []byte, i int) int {
	i++
	for {
		for plain[doc[i]] {
			i++
		}
		if doc[i] == '"' {
			return i + 1
		}
		i += 2 // an escape; the digits of \u are plain
	}
}

func skipNumber(doc []byte, i int) int {
	for i < len(doc) && numberByte[doc[i]] {
		i++
	}
	return i
}

var numberByte = func() (t [256]bool) {
	for _, c := range []byte("+-.0123456789eE") {
		t[c] = true
	}
	return t
}()
