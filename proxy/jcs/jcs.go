// Package jcs writes the RFC 8785 (JSON Canonicalization Scheme) form of a
// JSON text without building a tree of it.
//
// A tree of a hostile document costs many times the document: the library
// this package replaces allocated about a hundred bytes for every byte of
// "[{},{},...]". Here the canonical form is streamed into an io.Writer
// (usually a hash) from the document's own bytes, in three passes over them:
//
//  1. validate checks that the document is one I-JSON value (RFC 7493:
//     UTF-8, no lone surrogates, no duplicate names, numbers that a double
//     holds exactly) and counts the members of each non-empty object.
//  2. index lays out, for each non-empty object, a block of member spans:
//     two uint32 per member, the offset of its name and where the blocks of
//     the objects inside its value begin. The blocks are in the order their
//     objects open, so an object's block is followed by the blocks of the
//     objects inside it; index sorts each block by name as its object closes,
//     and refuses duplicates.
//  3. emit writes the document in that order, arrays as they come and
//     objects through their blocks, re-reading names and values from the
//     document.
//
// Nothing is written to the writer unless the whole document is accepted.
//
// # Bounds
//
// Scratch is sized before the work, from the document's length and colons,
// and never grown during it. A member takes at least five bytes of its
// document ("":0 and a comma or the closing brace), so a document of n bytes
// has at most n/5 members, and the spans take at most 8*(n/5+1) bytes, 1.6
// times the document, whatever its shape; they never take more than 8 bytes
// per ':' in the document either, so ordinary documents take far less. The
// stack of open objects takes 8 bytes a level, for at most MaxDepth levels;
// arrays take a bit a level in a fixed array. With the fixed state (about
// 1.3 KB, its 1 KiB write buffer included) and the allocator's size-class
// rounding, that is ScratchBound: no document of n bytes makes a call
// allocate more. It is under 2n from about 50 KB up; below, the fixed part
// dominates. Nothing else is allocated: no copies of strings, names or
// numbers, and no output buffer but the caller's when appending.
//
// Time is linear in the document, plus sorting each object's names
// (O(k log k) comparisons for k names, each comparison as long as the two
// names' common prefix). No part of the document is re-read once per level
// of nesting, as a canonicaliser that gathered an object's members by
// skipping over their values would, and nothing recurses on the goroutine
// stack: each pass keeps its own stack of open containers.
//
// # What is refused
//
// Anything encoding/json's json.Valid refuses; invalid UTF-8 and lone or
// mis-paired surrogate escapes in strings; duplicate member names (compared
// after unescaping); nesting deeper than MaxDepth; and numbers that could
// make two different values canonicalise alike: more than 15 significant
// digits, or a decimal magnitude beyond about 1e±300 (ErrImprecise).
// 820982911946154508 and 820982911946154509 are the same double, and RFC
// 8785 writes numbers as doubles.
package jcs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"unsafe"
)

// MaxDepth is how deeply arrays and objects may nest: a document of MaxDepth
// nested arrays is accepted, one more level is refused with ErrTooDeep.
// Real documents stay far below it; it bounds the stacks the passes keep.
const MaxDepth = 1000

// maxDocLen keeps every offset into the document within a uint32.
const maxDocLen = 1<<32 - 2

var (
	// ErrInvalid is a document that is not one JSON value, or whose strings
	// are not UTF-8 or hold a lone surrogate escape.
	ErrInvalid = errors.New("jcs: invalid JSON")
	// ErrDuplicate is an object with two members of one name.
	ErrDuplicate = errors.New("jcs: duplicate member name")
	// ErrImprecise is a number that a double does not hold exactly enough
	// to tell it from its neighbours (more than 15 significant digits, or a
	// magnitude beyond about 1e±300).
	ErrImprecise = errors.New("jcs: number does not fit a double")
	// ErrTooDeep is nesting deeper than MaxDepth.
	ErrTooDeep = errors.New("jcs: nesting too deep")
	// ErrTooLarge is a document of 4 GiB or more.
	ErrTooLarge = errors.New("jcs: document too large")
)

// Error says why a document was refused and at which byte. It unwraps to
// one of the Err variables. Its message quotes at most one byte of the
// document.
type Error struct {
	Err    error
	Offset int
	what   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%v at offset %d: %s", e.Err, e.Offset, e.what)
}

func (e *Error) Unwrap() error { return e.Err }

func fail(err error, off int, what string) *Error { return &Error{Err: err, Offset: off, what: what} }

// Write writes the RFC 8785 canonical form of the JSON text doc to w.
// Nothing is written when doc is refused. Output reaches w in writes of up
// to 1 KiB, except runs of a long string, which are passed on unbuffered.
func Write(w io.Writer, doc []byte) error {
	s := getState()
	s.out = sink{w: w, b: s.buf[:0]}
	err := s.run(doc)
	if err == nil {
		s.out.flush()
		err = s.out.err
	}
	putState(s)
	return err
}

// Append appends the RFC 8785 canonical form of the JSON text doc to dst.
// When doc is refused it returns dst unchanged and the error.
func Append(dst, doc []byte) ([]byte, error) {
	s := getState()
	s.out = sink{b: dst}
	err := s.run(doc)
	out := s.out.b
	putState(s)
	if err != nil {
		return dst, err
	}
	return out, nil
}

// ScratchBound is the most heap, in bytes, that Write or Append allocate for
// a document of docLen bytes, whatever its content, so that a caller can
// count it before the call. With m = docLen/5 + 1 (the most members the
// document can hold, plus one):
//
//	heap(8*m) + heap(8*min(m+1, MaxDepth)) + heap(sizeof state)
//
// where heap(b) = b + min(b/4, 8 KiB) + 16 allows for the allocator's
// rounding. The canonical output that Append appends is not included.
// From about 50 KB up it is under 2*docLen: 1.6*docLen plus about 20 KB.
func ScratchBound(docLen int) int {
	if docLen < 0 {
		docLen = 0
	}
	spans := docLen/5 + 1
	return heapBytes(spans*memberSize) + heapBytes(min(spans+1, MaxDepth)*frameSize) + heapBytes(stateSize)
}

// Scratch is the most heap, in bytes, that Write or Append allocate for
// doc itself: ScratchBound's sum for the members doc can hold, counted by
// its colons. It reads doc once (bytes.Count); for documents with few
// members it is far below ScratchBound.
func Scratch(doc []byte) int {
	members, frames := scratchFor(doc)
	return heapBytes(members*memberSize) + heapBytes(frames*frameSize) + heapBytes(stateSize)
}

// scratchFor is what run allocates for doc with no scratch to reuse.
func scratchFor(doc []byte) (members, frames int) {
	members = min(bytes.Count(doc, colon), len(doc)/5+1)
	return members, min(members+1, MaxDepth)
}

var colon = []byte{':'}

const (
	memberSize = int(unsafe.Sizeof(member{}))
	frameSize  = int(unsafe.Sizeof(frame{}))
	stateSize  = int(unsafe.Sizeof(state{}))
)

// heapBytes is at least what the allocator takes for an object of n bytes:
// small objects are rounded up to a size class (less than a quarter more,
// or 16 bytes), large ones to 8 KiB pages.
func heapBytes(n int) int {
	if n == 0 {
		return 0
	}
	return n + min(n/4, 8192) + 16
}

// member is one member of an object in its object's block. While emit
// writes an object, a slot whose member has been written holds instead the
// furthest value end and cursor of the members written so far.
type member struct {
	name uint32 // offset of the opening quote of the member's name
	sub  uint32 // first block of the objects inside the member's value
}

// frame is one open non-empty object. Each pass gives its words a meaning:
// in validate a is the object's index among the counts; in index a is the
// first slot of its block and b the next slot to fill; in emit a is the slot
// of the member being written and b the end of the block.
type frame struct{ a, b uint32 }

// state is the scratch of one call. It is pooled: spans of up to
// maxPooledMembers are kept with it, larger ones left to the collector, so
// that an idle pooled state holds at most about 140 KiB.
type state struct {
	doc     []byte
	members []member
	objects []frame
	nObj    int // non-empty objects, counted by validate
	nMem    int // members, counted by validate
	kinds   bitStack
	out     sink
	buf     [1024]byte
}

const maxPooledMembers = 16 << 10

var states = sync.Pool{New: func() any { return new(state) }}

func getState() *state { return states.Get().(*state) }

func putState(s *state) {
	s.doc = nil
	s.out = sink{}
	if cap(s.members) > maxPooledMembers {
		s.members = nil
	}
	states.Put(s)
}

func (s *state) run(doc []byte) error {
	if int64(len(doc)) > maxDocLen {
		return fail(ErrTooLarge, 0, "more than 4 GiB")
	}
	s.doc = doc
	nm, nf := scratchFor(doc)
	if cap(s.members) < nm {
		s.members = make([]member, nm)
	}
	s.members = s.members[:nm]
	if cap(s.objects) < nf {
		s.objects = make([]frame, 0, nf)
	}
	if err := s.validate(); err != nil {
		return err
	}
	// The counts move to the end of the spans that index will fill: an
	// object's count is read when it opens, and by then index has filled
	// only the blocks of objects that opened before it, which end before
	// its count (every later object has at least one member).
	copy(s.members[s.nMem-s.nObj:s.nMem], s.members[:s.nObj])
	if err := s.index(); err != nil {
		return err
	}
	s.emit()
	return nil
}

// bitStack is the kind of each open container, one bit a level.
type bitStack struct {
	depth int
	bits  [MaxDepth/64 + 1]uint64
}

func (k *bitStack) push(object bool) {
	w, b := k.depth/64, uint(k.depth%64)
	if object {
		k.bits[w] |= 1 << b
	} else {
		k.bits[w] &^= 1 << b
	}
	k.depth++
}

func (k *bitStack) pop() { k.depth-- }

// inObject reports whether the innermost open container is an object.
func (k *bitStack) inObject() bool {
	d := k.depth - 1
	return k.bits[d/64]&(1<<uint(d%64)) != 0
}

// sink batches output: into a fixed buffer flushed to w, or onto the
// caller's slice when w is nil.
type sink struct {
	w   io.Writer
	b   []byte
	err error
}

func (o *sink) flush() {
	if len(o.b) > 0 && o.err == nil {
		_, o.err = o.w.Write(o.b)
	}
	o.b = o.b[:0]
}

// room makes sure that n more bytes fit: by flushing when writing to w (n
// is at most the buffer's size), by growing the caller's slice otherwise.
func (o *sink) room(n int) {
	if cap(o.b)-len(o.b) < n {
		o.makeRoom(n)
	}
}

func (o *sink) makeRoom(n int) {
	if o.w != nil {
		o.flush()
	} else {
		o.b = slices.Grow(o.b, n)
	}
}

func (o *sink) byte(c byte) {
	if len(o.b) == cap(o.b) {
		o.makeRoom(1)
	}
	o.b = append(o.b, c)
}

func (o *sink) two(c, d byte) {
	if cap(o.b)-len(o.b) < 2 {
		o.makeRoom(2)
	}
	o.b = append(o.b, c, d)
}

func (o *sink) bytes(p []byte) {
	if o.w != nil && len(p) > cap(o.b)-len(o.b) {
		o.flush()
		if len(p) > cap(o.b) {
			if o.err == nil {
				_, o.err = o.w.Write(p)
			}
			return
		}
	}
	o.b = append(o.b, p...)
}
