package jcs

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func canon(t *testing.T, doc string) string {
	t.Helper()
	out, err := Append(nil, []byte(doc))
	if err != nil {
		t.Fatalf("Append(%.60q): %v", doc, err)
	}
	return string(out)
}

// TestRFC8785Files checks the RFC's input/output files byte for byte.
func TestRFC8785Files(t *testing.T) {
	inputs, err := filepath.Glob("testdata/input/*.json")
	if err != nil || len(inputs) < 10 {
		t.Fatalf("vectors: %v %v", inputs, err)
	}
	for _, in := range inputs {
		name := filepath.Base(in)
		doc, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("testdata/output", name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "values.json" {
			// 17 significant digits: refused here, where the RFC takes it.
			if _, err := Append(nil, doc); !errors.Is(err, ErrImprecise) {
				t.Errorf("%s: err = %v, want ErrImprecise", name, err)
			}
			doc = bytes.Replace(doc, []byte("333333333.33333329"), []byte("333333333.333333"), 1)
			want = bytes.Replace(want, []byte("333333333.3333333"), []byte("333333333.333333"), 1)
		}
		got, err := Append(nil, doc)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
		var buf bytes.Buffer
		if err := Write(&buf, doc); err != nil || !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("%s: Write gave %s, %v", name, buf.Bytes(), err)
		}
	}
}

// TestRFC8785Examples checks the examples in the RFC's text.
func TestRFC8785Examples(t *testing.T) {
	cases := []struct{ in, want string }{
		{ // 3.2.3: sorting by UTF-16 code units, not code points or UTF-8
			`{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
			  "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control",
			  "\u00f6": "Latin Small Letter O With Diaeresis"}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}",
		},
		{ // 3.2.2.2: strings
			`"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"`,
			`"€$\u000f\nA'B\"\\\\\"/"`,
		},
		{ // 3.2.2: literals and whitespace
			"\t[ null , true,false ]\r\n", `[null,true,false]`,
		},
		{ // 3.2.4 (UTF-8 as is; no normalisation)
			`"A\u030a"`, "\"A\u030a\"",
		},
		// Numbers, from the RFC's 3.2.2.3 and Appendix B, within 15 digits.
		{`[1E30, 4.50, 2e-3, 0.000000000000000000000000001]`, `[1e+30,4.5,0.002,1e-27]`},
		{`[-0, 0.0, -0.0e-5, 0e999999]`, `[0,0,0,0]`},
		{`[1e21, 1e20, 0.000001, 1e-7, 9e15]`, `[1e+21,100000000000000000000,0.000001,1e-7,9000000000000000]`},
		{`[123456789012345, -123456789012345, 1.23456789012345e-200]`, `[123456789012345,-123456789012345,1.23456789012345e-200]`},
		{`[1.5e+2, 1.5E-2, 15e-1, 0.015e2]`, `[150,0.015,1.5,1.5]`},
		{`[1e-299, 9.99999999999999e298]`, `[1e-299,9.99999999999999e+298]`},
		{`[1e0000000000000000000000000000005, 0.00000000000000000000000000000000000000000000000000000001e56]`, `[100000,1]`},
	}
	for _, c := range cases {
		if got := canon(t, c.in); got != c.want {
			t.Errorf("%.60q\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

func TestCanonicalForms(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{}`, `{}`},
		{` [ ] `, `[]`},
		{`{ "b" : [ { } , [ ] ] , "a" : { "d" : 1 , "c" : 2 } }`, `{"a":{"c":2,"d":1},"b":[{},[]]}`},
		{`[{"b":1,"a":2},{"d":{"f":[{"h":1,"g":2}],"e":0},"c":3}]`, `[{"a":2,"b":1},{"c":3,"d":{"e":0,"f":[{"g":2,"h":1}]}}]`},
		// Objects inside arrays inside a member that sorts after its
		// siblings: the blocks must be found out of document order.
		{`{"z":[{"y":1,"x":2},[{"w":{"v":3,"u":4}}]],"a":[{"c":1,"b":2}],"m":{"o":{"q":1,"p":2},"n":[{"s":1,"r":2}]}}`,
			`{"a":[{"b":2,"c":1}],"m":{"n":[{"r":2,"s":1}],"o":{"p":2,"q":1}},"z":[{"x":2,"y":1},[{"w":{"u":4,"v":3}}]]}`},
		// Escapes in names sort by what they stand for.
		{`{"\u0062":1,"a":2,"\"":3,"\\":4,"\/":5}`, `{"\"":3,"/":5,"\\":4,"a":2,"b":1}`},
		{`{"ab":1,"a":2,"a\u0000":3,"":4}`, `{"":4,"a":2,"a\u0000":3,"ab":1}`},
		// Supplementary characters sort by their surrogates, below U+E000.
		{"{\"\ue000\":1,\"\U0001F600\":2,\"\uffff\":3}", "{\"\U0001F600\":2,\"\ue000\":1,\"\uffff\":3}"},
		// Control characters: short escapes where there are, \u00xx else.
		{`"\u0000\u0001\u0008\u0009\u000a\u000b\u000c\u000d\u001f\u0020\u007f"`, "\"\\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f \u007f\""},
		{`"\b\f\n\r\t\"\\\/"`, `"\b\f\n\r\t\"\\/"`},
		{`"\uD83D\uDE00\u00E9"`, "\"\U0001F600\u00e9\""},
		{"\"caf\xc3\xa9 \xef\xbf\xbd\"", "\"caf\xc3\xa9 \xef\xbf\xbd\""}, // U+FFFD written as such is valid
		{`123`, `123`},
		{` true `, `true`},
	}
	for _, c := range cases {
		if got := canon(t, c.in); got != c.want {
			t.Errorf("%.80q\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

func TestErrors(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	deepObj := strings.Repeat(`{"a":`, MaxDepth) + "[1]" + strings.Repeat("}", MaxDepth)
	cases := []struct {
		in   string
		want error
	}{
		{`{"a":1,"a":2}`, ErrDuplicate},
		{`{"a":1,"\u0061":2}`, ErrDuplicate},
		{`{"b":{"x":1},"a":[{"c":1,"d":2,"c":3}]}`, ErrDuplicate},
		{"{\"\U0001F600\":1,\"\\ud83d\\ude00\":2}", ErrDuplicate},
		{`{"\/":1,"/":2}`, ErrDuplicate},
		{`"\ud800"`, ErrInvalid},
		{`"\udc00"`, ErrInvalid},
		{`"\ud800\u0041"`, ErrInvalid},
		{`"\ud800x"`, ErrInvalid},
		{`"\ud800\ud800"`, ErrInvalid},
		{`"\ud800\`, ErrInvalid},
		{`"\u12"`, ErrInvalid},
		{`"\x"`, ErrInvalid},
		{"\"\xff\"", ErrInvalid},
		{"\"\xed\xa0\x80\"", ErrInvalid}, // a surrogate in UTF-8
		{"\"\xc0\xaf\"", ErrInvalid},     // overlong
		{"\"\xe2\x82\"", ErrInvalid},     // truncated
		{"\"a\x00\"", ErrInvalid},
		{"\"a\nb\"", ErrInvalid},
		{deep, ErrTooDeep},
		{deepObj, ErrTooDeep},
		{`{} x`, ErrInvalid},
		{`1 2`, ErrInvalid},
		{`[1]]`, ErrInvalid},
		{`{}{}`, ErrInvalid},
		{"\xef\xbb\xbf{}", ErrInvalid},
		{``, ErrInvalid},
		{` `, ErrInvalid},
		{`[`, ErrInvalid},
		{`{"a"`, ErrInvalid},
		{`{"a":`, ErrInvalid},
		{`{"a":1`, ErrInvalid},
		{`[1,]`, ErrInvalid},
		{`{"a":1,}`, ErrInvalid},
		{`{,}`, ErrInvalid},
		{`{"a" 1}`, ErrInvalid},
		{`{1:1}`, ErrInvalid},
		{`[1 2]`, ErrInvalid},
		{`01`, ErrInvalid},
		{`1.`, ErrInvalid},
		{`.5`, ErrInvalid},
		{`-`, ErrInvalid},
		{`+1`, ErrInvalid},
		{`1e`, ErrInvalid},
		{`1e+`, ErrInvalid},
		{`0x10`, ErrInvalid},
		{`NaN`, ErrInvalid},
		{`tru`, ErrInvalid},
		{`nul`, ErrInvalid},
		{`truex`, ErrInvalid},
		{`'a'`, ErrInvalid},
		{`820982911946154508`, ErrImprecise},
		{`[820982911946154509]`, ErrImprecise},
		{`1234567890123456`, ErrImprecise},
		{`0.1234567890123456`, ErrImprecise},
		{`100000000000000000000e-5`, ErrImprecise}, // trailing zeros are digits
		{`1e400`, ErrImprecise},
		{`-1e400`, ErrImprecise},
		{`1e300`, ErrImprecise},
		{`1e-301`, ErrImprecise},
		{`1e-400`, ErrImprecise},
		{`[1e99999999999999999999]`, ErrImprecise},
		{`{"a":333333333.33333329}`, ErrImprecise},
		// More objects open than a document of this length could close:
		// the scratch runs out before the syntax does.
		{strings.Repeat(`{"":`, 50), ErrInvalid},
		{`[` + strings.Repeat(`{"":[{"":`, 30) + `0`, ErrInvalid},
		{strings.Repeat(`{"":`, 50) + `0` + strings.Repeat(`}`, 49), ErrInvalid},
	}
	for _, c := range cases {
		var w bytes.Buffer
		err := Write(&w, []byte(c.in))
		if err != nil && strings.Contains(err.Error(), "internal") {
			t.Errorf("%.40q: %v", c.in, err)
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%.40q: err = %v, want %v", c.in, err, c.want)
			continue
		}
		if w.Len() != 0 {
			t.Errorf("%.40q: wrote %q before refusing", c.in, w.Bytes())
		}
		var e *Error
		if !errors.As(err, &e) || e.Offset < 0 || e.Offset > len(c.in) {
			t.Errorf("%.40q: %#v, want an *Error with an offset in the document", c.in, err)
		}
		if dst, err := Append([]byte("x"), []byte(c.in)); err == nil || string(dst) != "x" {
			t.Errorf("%.40q: Append gave %q, %v", c.in, dst, err)
		}
	}
}

func TestErrorOffsets(t *testing.T) {
	for _, c := range []struct {
		in  string
		off int
	}{
		{`{"a":1, "b":2, "\u0061":3}`, 15},
		{`[1, 2, x]`, 7},
		{`[1, 2`, 5},
		{`{"a":[1e400]}`, 6},
		{"[\"ab\xff\"]", 4},
		{`["\ud800 "]`, 2},
	} {
		err := Write(io.Discard, []byte(c.in))
		var e *Error
		if !errors.As(err, &e) || e.Offset != c.off {
			t.Errorf("%q: %v, want offset %d", c.in, err, c.off)
		}
	}
}

// TestErrorMessagesQuoteLittle: a message names an offset and at most one
// byte of the document, however long the bad token.
func TestErrorMessagesQuoteLittle(t *testing.T) {
	secret := strings.Repeat("s3cr3t", 100)
	for _, doc := range []string{
		`{"` + secret + `":1,"` + secret + `":2}`,
		`["` + secret + "\x01" + `"]`,
		`[` + strings.Repeat("1", 600) + `]`,
		`"` + secret + `\q"`,
		secret,
		`[1, ` + secret + `]`,
	} {
		err := Write(io.Discard, []byte(doc))
		if err == nil {
			t.Fatalf("%.30q accepted", doc)
		}
		if msg := err.Error(); len(msg) > 160 || strings.Contains(msg, "s3c") || strings.Contains(msg, "111") {
			t.Errorf("message quotes the document: %q", msg)
		}
	}
}

func TestMaxDepth(t *testing.T) {
	arrays := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	if got := canon(t, arrays); got != arrays {
		t.Errorf("MaxDepth arrays: %.20s", got)
	}
	objects := strings.Repeat(`{"a":`, MaxDepth-1) + "{}" + strings.Repeat("}", MaxDepth-1)
	if got := canon(t, objects); got != objects {
		t.Errorf("MaxDepth objects: %.20s", got)
	}
	mixed := strings.Repeat(`[{"b":0,"a":`, MaxDepth/2) + "0" + strings.Repeat("}]", MaxDepth/2)
	want := strings.Repeat(`[{"a":`, MaxDepth/2) + "0" + strings.Repeat(`,"b":0}]`, MaxDepth/2)
	if got := canon(t, mixed); got != want {
		t.Errorf("MaxDepth mixed: %.40s", got)
	}
	for _, doc := range []string{"[" + arrays + "]", `{"a":` + objects + "}", "[" + mixed + "]"} {
		if err := Write(io.Discard, []byte(doc)); !errors.Is(err, ErrTooDeep) {
			t.Errorf("MaxDepth+1: %v", err)
		}
	}
}

// recorder keeps the size of every Write.
type recorder struct {
	bytes.Buffer
	sizes []int
}

func (r *recorder) Write(p []byte) (int, error) {
	r.sizes = append(r.sizes, len(p))
	return r.Buffer.Write(p)
}

// TestWriteBatches: output reaches w in few writes of at most the buffer's
// size, apart from long runs of a string, and matches Append.
func TestWriteBatches(t *testing.T) {
	long := strings.Repeat("x", 5000)
	doc := []byte(`{"b":[` + strings.Repeat(`1,"\u00e9",{"y":true,"x":null},`, 300) + `0],"a":"` + long + `"}`)
	want, err := Append(nil, doc)
	if err != nil {
		t.Fatal(err)
	}
	var r recorder
	if err := Write(&r, doc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Bytes(), want) {
		t.Fatalf("Write and Append differ")
	}
	for _, n := range r.sizes {
		if n > 1024 && (n < len(long) || n > len(long)+2) {
			t.Errorf("a write of %d bytes", n)
		}
	}
	if max := len(want)/512 + 3; len(r.sizes) > max {
		t.Errorf("%d writes for %d bytes", len(r.sizes), len(want))
	}
}

type failing struct{ n int }

var errWriter = errors.New("writer failed")

func (f *failing) Write(p []byte) (int, error) {
	f.n++
	return 0, errWriter
}

func TestWriteError(t *testing.T) {
	doc := []byte(`[` + strings.Repeat(`"0123456789",`, 1000) + `0]`)
	f := &failing{}
	if err := Write(f, doc); err != errWriter {
		t.Fatalf("err = %v", err)
	}
	if f.n != 1 {
		t.Errorf("%d writes after the writer failed once", f.n)
	}
}

// TestHashes: the use it is for. Member order and whitespace do not change
// the digest; a different number does.
func TestHashes(t *testing.T) {
	sum := func(doc string) [32]byte {
		h := sha256.New()
		if err := Write(h, []byte(doc)); err != nil {
			t.Fatal(err)
		}
		var s [32]byte
		h.Sum(s[:0])
		return s
	}
	a := sum(`{"amount":100,"currency":"EUR","items":[{"id":1,"q":2}]}`)
	b := sum(" {\n \"items\" : [ {\"q\":2, \"id\":1.0} ],\"currency\":\"\\u0045UR\", \"amount\":1e2}\n")
	c := sum(`{"amount":100.5,"currency":"EUR","items":[{"id":1,"q":2}]}`)
	if a != b || a == c {
		t.Errorf("digests: %x %x %x", a, b, c)
	}
}
