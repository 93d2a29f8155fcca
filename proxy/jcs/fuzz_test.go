package jcs

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
)

// FuzzWrite holds this package to github.com/gowebpki/jcs, the tree-building
// canonicaliser it replaces, and to encoding/json:
//
//   - it never panics, and Write and Append agree;
//   - what it accepts, json.Valid accepts, and gowebpki/jcs's Transform
//     accepts and canonicalises to the same bytes, which canonicalise to
//     themselves (or are refused as imprecise: see below);
//   - what json.Valid refuses, it refuses;
//   - what it refuses that Transform accepts, it refuses for one of the two
//     reasons it means to: a number beyond the 15-digit / 1e±300 rule
//     (ErrImprecise; Transform takes such numbers as the nearest double),
//     or nesting deeper than MaxDepth (ErrTooDeep; Transform allows
//     10000). Transform refuses duplicate names, lone surrogates and
//     invalid UTF-8 as this package does, so those are not exceptions.
func FuzzWrite(f *testing.F) {
	inputs, _ := filepath.Glob("testdata/input/*.json")
	for _, in := range inputs {
		if doc, err := os.ReadFile(in); err == nil {
			f.Add(doc)
		}
	}
	for _, s := range []string{
		`{}`, `[]`, `null`, `true`, `false`, `0`, `-0`, `-1.5e-7`, `1e21`, `1E+2`,
		`{"a":1,"b":[1,2,3]}`, `{"b":{"a":[{},[]]},"a":{"b":[{"d":1,"c":2}]}}`,
		`[{},{},{},{}]`, `{"a":{"a":{"a":{}}}}`, `[[[[[]]]]]`,
		`{"\u0061":1,"a":2}`, `{"\ud83d\ude00":1,"\ue000":2,"\uffff":3}`,
		`["\ud800"]`, `["\udc00\ud800"]`, `"\u00e9\u20AC\/\b"`,
		"[\"caf\xc3\xa9\"]", "[\"\xff\"]", "\"\xed\xa0\x80\"",
		`  {"a" : 1}  `, `{"a":1} x`, `[1,]`, `{"a":1,}`, `01`, `1.`,
		`820982911946154508`, `1e400`, `1e-400`, `0.000000000000000000001`,
		`{"z":[{"y":1,"x":2},[{"w":{"v":3,"u":4}}]],"a":[{"c":1,"b":2}],"m":{"o":{"q":1,"p":2}}}`,
		strings.Repeat(`{"":`, 40) + `0` + strings.Repeat(`}`, 40),
		strings.Repeat(`[{"a":`, 30) + `0` + strings.Repeat(`}]`, 30),
		strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
	} {
		f.Add([]byte(s))
	}
	r := rand.New(rand.NewPCG(7, 8))
	for k := 0; k < 30; k++ {
		var b bytes.Buffer
		randomValue(r, &b, 2+k%6)
		f.Add(b.Bytes())
	}

	f.Fuzz(func(t *testing.T, doc []byte) {
		out, err := Append(nil, doc)
		var w bytes.Buffer
		werr := Write(&w, doc)
		if (err == nil) != (werr == nil) || !bytes.Equal(out, w.Bytes()) {
			t.Fatalf("Append and Write disagree on %q: %q %v / %q %v", doc, out, err, w.Bytes(), werr)
		}
		valid := json.Valid(doc)
		ref, refErr := jcs.Transform(doc)

		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Offset < 0 || e.Offset > len(doc) {
				t.Fatalf("%q: error %v is not an *Error with an offset in the document", doc, err)
			}
			if refErr == nil && valid && !errors.Is(err, ErrImprecise) && !errors.Is(err, ErrTooDeep) {
				t.Fatalf("%q: refused (%v) what gowebpki/jcs and json.Valid accept", doc, err)
			}
			return
		}
		if !valid {
			t.Fatalf("%q: accepted what json.Valid refuses, as %q", doc, out)
		}
		if refErr != nil {
			t.Fatalf("%q: accepted as %q what gowebpki/jcs refuses: %v", doc, out, refErr)
		}
		if !bytes.Equal(out, ref) {
			t.Fatalf("%q:\n got %q\nwant %q", doc, out, ref)
		}
		// The canonical form of a number can break the rule its literal
		// kept (1e20 is written 100000000000000000000, 21 digits), so the
		// second pass may refuse; it must not change anything.
		again, err := Append(nil, out)
		if (err != nil && !errors.Is(err, ErrImprecise)) || (err == nil && !bytes.Equal(again, out)) {
			t.Fatalf("%q: canonical form %q canonicalises to %q, %v", doc, out, again, err)
		}
	})
}

// TestRandomDocuments holds Append to gowebpki/jcs on random documents
// whose objects nest inside arrays inside objects, with names that tie,
// escape and straddle the UTF-16 surrogate range: the shapes that exercise
// the blocks and cursors, which random bytes reach slowly.
func TestRandomDocuments(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	n := 20000
	if testing.Short() {
		n = 2000
	}
	accepted := 0
	for k := 0; k < n; k++ {
		var b bytes.Buffer
		randomValue(r, &b, 1+r.IntN(7))
		doc := b.Bytes()
		got, err := Append(nil, doc)
		want, werr := jcs.Transform(doc)
		if (err == nil) != (werr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("%s:\n got %s (%v)\nwant %s (%v)", doc, got, err, want, werr)
		}
		if err == nil {
			accepted++
		} else if !errors.Is(err, ErrDuplicate) {
			t.Fatalf("%s: %v", doc, err)
		}
	}
	if accepted < n/4 {
		t.Errorf("only %d of %d documents accepted", accepted, n)
	}
}

var randomNames = []string{
	`a`, `b`, `aa`, `ab`, `\u0061`, `A`, `1`, `10`, ``, `é`, `\u00e9`, `\u00E9b`,
	`😀`, `\ud83d\ude00`, `\ud83d\ude01`, "\ue000", `\ue000`, "\uffff", `\n`, `\u000a`,
	`\"`, `\\`, `\/`, `/`, "\u0080", `€`, `a\u0000`, `a\u0000b`, `z`, `zz`,
}

var randomScalars = []string{
	`0`, `-0`, `1`, `-1.5`, `1e21`, `1E-7`, `0.000001`, `123456789012345`, `4.50`,
	`true`, `false`, `null`, `""`, `"x"`, `"\u0000\b\u001f"`, `"\ud83d\ude00 \u20ac"`, `"\/\\\""`,
}

func randomSpace(r *rand.Rand, b *bytes.Buffer) {
	if r.IntN(4) == 0 {
		b.WriteByte(" \t\n\r"[r.IntN(4)])
	}
}

func randomValue(r *rand.Rand, b *bytes.Buffer, depth int) {
	randomSpace(r, b)
	switch k := r.IntN(8); {
	case depth > 0 && k < 3:
		b.WriteByte('{')
		for i, n := 0, r.IntN(6); i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			randomSpace(r, b)
			b.WriteString(`"` + randomNames[r.IntN(len(randomNames))] + `"`)
			randomSpace(r, b)
			b.WriteByte(':')
			randomValue(r, b, depth-1)
		}
		randomSpace(r, b)
		b.WriteByte('}')
	case depth > 0 && k < 5:
		b.WriteByte('[')
		for i, n := 0, r.IntN(5); i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			randomValue(r, b, depth-1)
		}
		randomSpace(r, b)
		b.WriteByte(']')
	default:
		b.WriteString(randomScalars[r.IntN(len(randomScalars))])
	}
	randomSpace(r, b)
}
