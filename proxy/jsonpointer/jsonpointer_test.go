package jsonpointer_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemproxy/idemproxy/proxy/jsonpointer"
)

func TestParsePointer(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string // nil with ok: no tokens
		bad  bool
	}{
		{in: "", want: nil},
		{in: "/", want: []string{""}},
		{in: "//", want: []string{"", ""}},
		{in: "/foo", want: []string{"foo"}},
		{in: "/foo/0", want: []string{"foo", "0"}},
		{in: "/a~1b", want: []string{"a/b"}},
		{in: "/m~0n", want: []string{"m~n"}},
		{in: "/~01", want: []string{"~1"}}, // ~0 first: "~01" is "~" then "1", not "/"
		{in: "/~10", want: []string{"/0"}}, // and ~1 then 0
		{in: "/~0~1~0", want: []string{"~/~"}},
		{in: "/data/object/id", want: []string{"data", "object", "id"}},
		{in: "/ /é/😀", want: []string{" ", "é", "😀"}},
		{in: "/a/", want: []string{"a", ""}},
		{in: "foo", bad: true},
		{in: "#/foo", bad: true}, // URI fragment form is not accepted
		{in: " /foo", bad: true},
		{in: "/~", bad: true},
		{in: "/a~", bad: true},
		{in: "/~2", bad: true},
		{in: "/~a/b", bad: true},
		{in: "/ok/~~0", bad: true},
	} {
		got, err := jsonpointer.Parse(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("Parse(%q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) || (tc.want == nil) != (len(got) == 0) {
			t.Errorf("Parse(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// value is Find then Text: the key text at ptr, or the error that says why
// there is none.
func value(doc []byte, tokens jsonpointer.Pointer) (string, error) {
	v, err := tokens.Find(doc)
	if err != nil {
		return "", err
	}
	return jsonpointer.Text(v)
}

// rfc6901Doc is the example document of RFC 6901 section 5.
const rfc6901Doc = `{
      "foo": ["bar", "baz"],
      "": 0,
      "a/b": 1,
      "c%d": 2,
      "e^f": 3,
      "g|h": 4,
      "i\\j": 5,
      "k\"l": 6,
      " ": 7,
      "m~n": 8
   }`

func TestJSONPointerValue(t *testing.T) {
	const nested = `{"data":{"object":{"id":"pi_1","amount":2000,"obj":{"deep":[{"x":"y"}]}}},"id":"evt_1"}`
	const spaced = " \t\r\n{ \n\"a\" \t:\r\n [ 1 , \"two\" ,\n{ \"b\" : -0.5e-3 } ] , \"c\" : \"d\" \n} \n"
	deep := strings.Repeat(`{"a":[`, 200) + `"bottom"` + strings.Repeat(`]}`, 200)
	deepPtr := strings.Repeat("/a/0", 200)
	for _, tc := range []struct {
		name, doc, ptr string
		want           string
		ok             bool
		err            error // the reason when not ok, where it matters
	}{
		// RFC 6901 section 5; only strings and numbers are values here.
		{"rfc whole", rfc6901Doc, "", "", false, nil},
		{"rfc foo", rfc6901Doc, "/foo", "", false, nil},
		{"rfc foo/0", rfc6901Doc, "/foo/0", "bar", true, nil},
		{"rfc foo/1", rfc6901Doc, "/foo/1", "baz", true, nil},
		{"rfc empty name", rfc6901Doc, "/", "0", true, nil},
		{"rfc a/b", rfc6901Doc, "/a~1b", "1", true, nil},
		{"rfc c%d", rfc6901Doc, "/c%d", "2", true, nil},
		{"rfc e^f", rfc6901Doc, "/e^f", "3", true, nil},
		{"rfc g|h", rfc6901Doc, "/g|h", "4", true, nil},
		{"rfc i\\j", rfc6901Doc, `/i\j`, "5", true, nil},
		{"rfc k\"l", rfc6901Doc, `/k"l`, "6", true, nil},
		{"rfc space", rfc6901Doc, "/ ", "7", true, nil},
		{"rfc m~n", rfc6901Doc, "/m~0n", "8", true, nil},
		{"rfc unescaped a/b is two tokens", rfc6901Doc, "/a/b", "", false, nil},
		{"rfc foo/2", rfc6901Doc, "/foo/2", "", false, nil},

		// The whole document.
		{"whole string", `"abc"`, "", "abc", true, nil},
		{"whole number", ` 42 `, "", "42", true, nil},
		{"whole null", `null`, "", "", false, nil},
		{"whole array", `[1]`, "", "", false, nil},

		// Nested paths.
		{"nested id", nested, "/data/object/id", "pi_1", true, nil},
		{"top id after nested", nested, "/id", "evt_1", true, nil},
		{"nested number", nested, "/data/object/amount", "2000", true, nil},
		{"deep array", nested, "/data/object/obj/deep/0/x", "y", true, nil},
		{"object not a value", nested, "/data/object", "", false, nil},
		{"missing member", nested, "/data/object/nope", "", false, nil},
		{"missing top", nested, "/nope/id", "", false, nil},
		{"through a string", nested, "/id/0", "", false, nil},
		{"through a number", nested, "/data/object/amount/x", "", false, nil},
		{"index on object", nested, "/data/0", "", false, nil},
		{"name on array", nested, "/data/object/obj/deep/x", "", false, nil},
		{"prefix of a name", nested, "/dat", "", false, nil},
		{"longer than a name", nested, "/datas", "", false, nil},

		// Escapes in names and values.
		{"value \\n", `{"a":"x\ny"}`, "/a", "x\ny", true, nil},
		{"value all short escapes", `{"a":"\"\\\/\b\f\n\r\t"}`, "/a", "\"\\/\b\f\n\r\t", true, nil},
		{"value \\u00e9", `{"a":"caf\u00e9"}`, "/a", "café", true, nil},
		{"value \\u00E9 upper hex", `{"a":"caf\u00E9"}`, "/a", "café", true, nil},
		{"value raw é", `{"a":"café"}`, "/a", "café", true, nil},
		{"value surrogate pair", `{"a":"\ud83d\ude00!"}`, "/a", "😀!", true, nil},
		// A string a decoder would change (U+FFFD in place of what was
		// sent) is no usable key: two different ids would decode alike.
		{"value lone high surrogate", `{"a":"\ud83dx"}`, "/a", "", false, jsonpointer.ErrReplaced},
		{"value lone low surrogate", `{"a":"\ude00"}`, "/a", "", false, jsonpointer.ErrReplaced},
		{"value reversed pair", `{"a":"\ude00\ud83d"}`, "/a", "", false, jsonpointer.ErrReplaced},
		{"value high then BMP escape", `{"a":"\ud83d\u0041"}`, "/a", "", false, jsonpointer.ErrReplaced},
		{"value invalid UTF-8", "{\"a\":\"x\xffy\xe2\x82\"}", "/a", "", false, jsonpointer.ErrReplaced},
		// U+FFFD the sender wrote is an ordinary character.
		{"value escaped U+FFFD", `{"a":"evt_\ufffd_1"}`, "/a", "evt_\uFFFD_1", true, nil},
		{"value escaped U+FFFD upper hex", `{"a":"evt_3\uFFFD"}`, "/a", "evt_3\uFFFD", true, nil},
		{"value raw U+FFFD", "{\"a\":\"evt_\xef\xbf\xbd_2\"}", "/a", "evt_\uFFFD_2", true, nil},
		{"value \\u0000", `{"a":"\u0000"}`, "/a", "\x00", true, nil},
		{"value escaped quote then more", `{"a":"\"","b":"c"}`, "/b", "c", true, nil},
		{"value ends in backslash", `{"a":"x\\","b":"c"}`, "/a", `x\`, true, nil},
		{"name escaped", `{"\u0061":"x"}`, "/a", "x", true, nil},
		{"name escaped slash", `{"a\/b":"x"}`, "/a~1b", "x", true, nil},
		{"name escaped é", `{"caf\u00e9":"x"}`, "/café", "x", true, nil},
		{"name raw é", `{"café":"x"}`, "/café", "x", true, nil},
		{"name surrogate pair", `{"\ud83d\ude00":"x"}`, "/😀", "x", true, nil},
		{"name lone surrogate", `{"\ud83d":"x"}`, "/\uFFFD", "x", true, nil},
		{"name invalid UTF-8", "{\"\xff\":\"x\"}", "/\uFFFD", "x", true, nil},
		{"name invalid UTF-8 not as bytes", "{\"\xff\":\"x\"}", "/\xff", "", false, nil},
		{"name with escaped quote skipped", `{"k\"l":"x","k":"y"}`, "/k", "y", true, nil},
		{"name with backslash pair", `{"a\\":"x"}`, `/a\`, "x", true, nil},
		{"name long escaped", `{"` + strings.Repeat(`\u0061`, 200) + `":"x"}`, "/" + strings.Repeat("a", 200), "x", true, nil},
		{"value long escaped", `{"a":"` + strings.Repeat(`\u00e9`, 200) + `"}`, "/a", strings.Repeat("é", 200), true, nil},

		// Numbers are kept as written.
		{"number 1.50", `{"n":1.50}`, "/n", "1.50", true, nil},
		{"number -0", `{"n":-0}`, "/n", "-0", true, nil},
		{"number 1E+3", `{"n":1E+3}`, "/n", "1E+3", true, nil},
		{"number 1e3", `{"n":1e3}`, "/n", "1e3", true, nil},
		{"number -1.5e-10", `{"n":-1.5e-10,"m":1}`, "/n", "-1.5e-10", true, nil},
		{"number huge", `{"n":123456789012345678901234567890}`, "/n", "123456789012345678901234567890", true, nil},
		{"number in array", `[0.10]`, "/0", "0.10", true, nil},

		// Wrong types at the end.
		{"true", `{"a":true}`, "/a", "", false, nil},
		{"false", `{"a":false}`, "/a", "", false, nil},
		{"null", `{"a":null}`, "/a", "", false, nil},
		{"empty object", `{"a":{}}`, "/a", "", false, nil},
		{"empty array", `{"a":[]}`, "/a", "", false, nil},

		// Whitespace everywhere.
		{"spaced array 1", spaced, "/a/1", "two", true, nil},
		{"spaced number", spaced, "/a/2/b", "-0.5e-3", true, nil},
		{"spaced first", spaced, "/a/0", "1", true, nil},
		{"spaced last", spaced, "/c", "d", true, nil},

		// Duplicates on the path: parsers disagree on which one counts
		// (encoding/json the last, gjson and cJSON the first), so none does.
		{"duplicate", `{"a":"first","a":"second"}`, "/a", "", false, jsonpointer.ErrDuplicate},
		{"duplicate escaped spelling", `{"a":"first","\u0061":"second"}`, "/a", "", false, jsonpointer.ErrDuplicate},
		{"duplicate three", `{"a":1,"b":2,"a":3,"c":4,"a":5,"d":6}`, "/a", "", false, jsonpointer.ErrDuplicate},
		{"duplicate last is not a value", `{"a":"x","a":null}`, "/a", "", false, jsonpointer.ErrDuplicate},
		{"duplicate last is object", `{"a":"x","a":{"b":"y"}}`, "/a/b", "", false, jsonpointer.ErrDuplicate},
		{"duplicate first object dropped", `{"a":{"b":"y"},"a":{"c":"z"}}`, "/a/b", "", false, jsonpointer.ErrDuplicate},
		{"duplicate nested", `{"o":{"id":"1","id":"2"},"o":{"x":0,"id":"3","id":"4"}}`, "/o/id", "", false, jsonpointer.ErrDuplicate},
		{"duplicate inside the member", `{"o":{"id":"1","id":"2"},"p":0}`, "/o/id", "", false, jsonpointer.ErrDuplicate},
		{"duplicate after the member", `{"id":"A","object":"event","id":"B"}`, "/id", "", false, jsonpointer.ErrDuplicate},
		{"duplicate in an element", `{"items":[{"id":"A","id":"B"}]}`, "/items/0/id", "", false, jsonpointer.ErrDuplicate},
		// Off the path, a duplicate is the fingerprint's business, not the key's.
		{"duplicate off the path", `{"a":"x","b":1,"b":2}`, "/a", "x", true, nil},
		{"duplicate in a sibling", `{"o":{"b":1,"b":2},"a":"x"}`, "/a", "x", true, nil},
		{"duplicate in another element", `{"items":[{"id":"A"},{"id":"B","id":"C"}]}`, "/items/0/id", "A", true, nil},

		// Arrays.
		{"index 0", `["a","b"]`, "/0", "a", true, nil},
		{"index 1", `["a","b"]`, "/1", "b", true, nil},
		{"index out of range", `["a","b"]`, "/2", "", false, nil},
		{"index on empty", `[]`, "/0", "", false, nil},
		{"index leading zero", `["a","b"]`, "/01", "", false, nil},
		{"index 00", `["a"]`, "/00", "", false, nil},
		{"index -", `["a","b"]`, "/-", "", false, nil},
		{"index negative", `["a","b"]`, "/-1", "", false, nil},
		{"index plus", `["a","b"]`, "/+1", "", false, nil},
		{"index empty", `["a","b"]`, "/", "", false, nil},
		{"index space", `["a","b"]`, "/ 1", "", false, nil},
		{"index hex", `["a","b"]`, "/0x1", "", false, nil},
		{"index huge", `["a","b"]`, "/99999999999999999999999999", "", false, nil},
		{"index 12", `[0,1,2,3,4,5,6,7,8,9,10,11,"twelve"]`, "/12", "twelve", true, nil},
		{"index skips containers", `[{"a":[1,{"]":"["}]},[[]],"x"]`, "/2", "x", true, nil},
		{"index skips literals", `[true,false,null,-1.5,"x"]`, "/4", "x", true, nil},

		// Deep nesting.
		{"deep", deep, deepPtr, "bottom", true, nil},
		{"deep one short", deep, deepPtr[:len(deepPtr)-2], "", false, nil},
		{"deep skipped", `{"s":` + deep + `,"t":"x"}`, "/t", "x", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tokens, err := jsonpointer.Parse(tc.ptr)
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid([]byte(tc.doc)) {
				t.Fatalf("test document is not valid JSON: %s", tc.doc)
			}
			got, err := value([]byte(tc.doc), tokens)
			if ok := err == nil; got != tc.want || ok != tc.ok || (tc.err != nil && !errors.Is(err, tc.err)) {
				t.Errorf("value(%s, %q) = %q, %v; want %q, %v", tc.doc, tc.ptr, got, err, tc.want, tc.err)
			}
			// The table agrees with encoding/json too.
			checkReference(t, []byte(tc.doc), tokens, got, err)
		})
	}
}

// TestJSONPointerNotJSON: the caller checks json.Valid first, but a document
// that is not JSON must not make jsonPointerValue panic or loop.
func TestJSONPointerNotJSON(t *testing.T) {
	for _, doc := range []string{"", " ", "{", "[", `{"a"`, `{"a":`, `{"a":"b"`, `{"a":"b",`, `["x",`, `{"a":tru`,
		`{"a":{"b":[`, `"abc`, `"\`, `{"a" "b"}`, `[1 2]`, `}`, `]`, `{"\u12":"x"}`, `{"a":"\u12"}`, `{"a":"\ud83d\u"}`,
		"{\"a\":\"\\", `[[[[[[`, `{"a":[1,2,3}`, `nul`, `-`, `{1:2}`} {
		for _, ptr := range []string{"", "/", "/a", "/0", "/a/b", "/a/0", "/a/b/c/d"} {
			tokens, _ := jsonpointer.Parse(ptr)
			_, _ = value([]byte(doc), tokens)
		}
	}
}

// refMember is one member of an object as encoding/json's tokenizer reads
// it; an object is the list of its members in order, duplicates kept.
type refMember struct {
	name string
	v    any
}

// refDecode reads one value from dec into a tree of []refMember (objects),
// []any (arrays), string, json.Number, bool and nil.
func refDecode(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		obj := []refMember{}
		for dec.More() {
			name, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := refDecode(dec)
			if err != nil {
				return nil, err
			}
			obj = append(obj, refMember{name.(string), v})
		}
		_, err = dec.Token()
		return obj, err
	case json.Delim('['):
		arr := []any{}
		for dec.More() {
			v, err := refDecode(dec)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		_, err = dec.Token()
		return arr, err
	}
	return tok, nil
}

// refResult is what the reference finds at a pointer.
type refResult int

const (
	refText refResult = iota
	refNotFound
	refNotText
	refDuplicate
)

// refLookup is Find and Text done with encoding/json: decode the whole
// document (numbers as json.Number) and walk the tree, refusing a member
// named twice on the path.
func refLookup(t testing.TB, doc []byte, tokens []string) (string, refResult) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	v, err := refDecode(dec)
	if err != nil {
		t.Fatalf("encoding/json cannot decode a document json.Valid accepts: %v\n%q", err, doc)
	}
	for _, tok := range tokens {
		switch x := v.(type) {
		case []refMember:
			n := 0
			for _, m := range x {
				if m.name == tok {
					n++
					v = m.v
				}
			}
			switch n {
			case 0:
				return "", refNotFound
			case 1:
			default:
				return "", refDuplicate
			}
		case []any:
			n, err := strconv.Atoi(tok)
			if err != nil || n < 0 || n >= len(x) || strconv.Itoa(n) != tok {
				return "", refNotFound
			}
			v = x[n]
		default:
			return "", refNotFound
		}
	}
	switch x := v.(type) {
	case string:
		return x, refText
	case json.Number:
		return string(x), refText
	}
	return "", refNotText
}

// replaceable reports whether a raw JSON string holds what a decoder
// replaces with U+FFFD: invalid UTF-8, or a \u escape of a surrogate (paired
// ones included: the reference cannot tell, and the table tests pairs).
var surrogateEscape = regexp.MustCompile(`(?i)\\u d[89a-f][0-9a-f]{2}`)

func replaceable(raw []byte) bool {
	return !utf8.Valid(raw) || surrogateEscape.Match(bytes.ReplaceAll(raw, []byte(`\u`), []byte(`\u `)))
}

// checkReference fails t unless value's result (got, err) for doc at tokens
// agrees with refLookup's. A string the reference decoded with a U+FFFD
// may be refused as ErrReplaced, and only when its raw bytes hold what a
// decoder replaces.
func checkReference(t testing.TB, doc []byte, tokens []string, got string, err error) {
	t.Helper()
	want, kind := refLookup(t, doc, tokens)
	switch kind {
	case refDuplicate:
		if !errors.Is(err, jsonpointer.ErrDuplicate) {
			t.Fatalf("document %q pointer %q: got %q, %v; a member on the path appears twice", doc, tokens, got, err)
		}
	case refNotFound:
		if !errors.Is(err, jsonpointer.ErrNotFound) {
			t.Fatalf("document %q pointer %q: got %q, %v; encoding/json finds nothing there", doc, tokens, got, err)
		}
	case refNotText:
		if !errors.Is(err, jsonpointer.ErrNotText) {
			t.Fatalf("document %q pointer %q: got %q, %v; encoding/json finds neither string nor number", doc, tokens, got, err)
		}
	case refText:
		if errors.Is(err, jsonpointer.ErrReplaced) {
			raw, _ := jsonpointer.Pointer(tokens).Find(doc)
			if !strings.ContainsRune(want, utf8.RuneError) || !replaceable(raw) {
				t.Fatalf("document %q pointer %q: refused as replaced, but encoding/json reads %q from %q", doc, tokens, want, raw)
			}
			return
		}
		if err != nil || got != want {
			t.Fatalf("document %q pointer %q: got %q, %v; encoding/json gives %q", doc, tokens, got, err, want)
		}
	}
}

// TestJSONPointerAllocs pins the cost: one allocation for the value, none
// for a miss.
func TestJSONPointerAllocs(t *testing.T) {
	doc := []byte(stripeEvent)
	for _, tc := range []struct {
		ptr  string
		want float64
	}{
		{"/id", 1},
		{"/data/object/id", 1},
		{"/data/object/amount", 1},
		{"/data/object/description", 1}, // escaped value, decoded on the stack
		{"/data/object/nope", 0},
		{"/livemode", 0},
	} {
		tokens, err := jsonpointer.Parse(tc.ptr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := value(doc, tokens); (err == nil) != (tc.want == 1) {
			t.Fatalf("%s: %v", tc.ptr, err)
		}
		if got := testing.AllocsPerRun(100, func() { _, _ = value(doc, tokens) }); got != tc.want {
			t.Errorf("%s: %v allocations, want %v", tc.ptr, got, tc.want)
		}
	}
}

// jpGen writes random JSON documents with awkward spellings (escapes,
// duplicates, whitespace, invalid UTF-8) and records the pointer of every
// value it writes.
type jpGen struct {
	r     *rand.Rand
	b     []byte
	paths [][]string
}

var (
	jpGenNames  = []string{"a", "b", "id", "", " ", "a/b", "m~n", "~1", "é", "😀", `"`, `\`, "x\ny", "0", "1", "\uFFFD"}
	jpGenRunes  = []rune{'a', 'Z', '0', ' ', '"', '\\', '/', '~', '\n', '\t', '\x00', '\x1f', 'é', '€', '😀', '\u2028', '\uFFFD', 0x7f}
	jpGenNumber = []string{"0", "-0", "1", "1.50", "1E+3", "1e-7", "-12.5e10", "0.0", "123456789012345678901234567890", "2e308"}
	jpGenSpace  = []string{"", "", "", " ", "\n", "\t", "\r\n  "}
)

func (g *jpGen) space() { g.b = append(g.b, jpGenSpace[g.r.IntN(len(jpGenSpace))]...) }

// str writes s as a JSON string, spelling each rune at random as itself, a
// short escape or a \u escape; now and then it adds invalid UTF-8 or a lone
// surrogate (which decode to U+FFFD, so s is then not the value).
func (g *jpGen) str(s string) {
	g.b = append(g.b, '"')
	for _, r := range s {
		switch how := g.r.IntN(4); {
		case how == 0 && r < 0x10000:
			g.b = fmt.Appendf(g.b, `\u%04x`, r)
		case how == 0:
			r -= 0x10000
			g.b = fmt.Appendf(g.b, `\u%04X\u%04X`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		case r == '"' || r == '\\':
			g.b = append(g.b, '\\', byte(r))
		case r == '/' && how == 1:
			g.b = append(g.b, `\/`...)
		case r == '\n':
			g.b = append(g.b, `\n`...)
		case r == '\t':
			g.b = append(g.b, `\t`...)
		case r < 0x20:
			g.b = fmt.Appendf(g.b, `\u%04x`, r)
		default:
			g.b = utf8.AppendRune(g.b, r)
		}
	}
	if g.r.IntN(10) == 0 {
		bad := []string{"\xff", "\xc3", "\xe2\x82", "\xed\xa0\x80", `\ud800`, `\udc00`, `\ude00\ud83d`, `\ud83d\u0041`, `\ud83dx`}
		g.b = append(g.b, bad[g.r.IntN(len(bad))]...)
	}
	g.b = append(g.b, '"')
}

func (g *jpGen) randString() string {
	var sb strings.Builder
	for n := g.r.IntN(6); n > 0; n-- {
		sb.WriteRune(jpGenRunes[g.r.IntN(len(jpGenRunes))])
	}
	return sb.String()
}

func (g *jpGen) value(path []string, depth int) {
	g.paths = append(g.paths, slices.Clone(path))
	kind := g.r.IntN(8)
	if depth >= 4 && kind >= 5 {
		kind = g.r.IntN(5)
	}
	switch kind {
	case 0, 1:
		g.str(g.randString())
	case 2, 3:
		g.b = append(g.b, jpGenNumber[g.r.IntN(len(jpGenNumber))]...)
	case 4:
		g.b = append(g.b, []string{"true", "false", "null"}[g.r.IntN(3)]...)
	case 5, 6:
		g.b = append(g.b, '{')
		for i, n := 0, g.r.IntN(5); i < n; i++ {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.space()
			name := jpGenNames[g.r.IntN(len(jpGenNames))]
			g.str(name)
			g.space()
			g.b = append(g.b, ':')
			g.space()
			g.value(append(path, name), depth+1)
			g.space()
		}
		g.b = append(g.b, '}')
	case 7:
		g.b = append(g.b, '[')
		for i, n := 0, g.r.IntN(5); i < n; i++ {
			if i > 0 {
				g.b = append(g.b, ',')
			}
			g.space()
			g.value(append(path, strconv.Itoa(i)), depth+1)
			g.space()
		}
		g.b = append(g.b, ']')
	}
}

// TestJSONPointerMatchesEncodingJSON compares jsonPointerValue with the
// encoding/json reference on random documents, at every path the generator
// wrote a value and at near misses of those paths.
func TestJSONPointerMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(6901, 1))
	hits, checks := 0, 0
	for range 3000 {
		g := &jpGen{r: r}
		g.space()
		g.value(nil, 0)
		g.space()
		doc := g.b
		if !json.Valid(doc) {
			t.Fatalf("generator wrote invalid JSON: %q", doc)
		}
		var pointers [][]string
		for _, p := range g.paths {
			pointers = append(pointers, p,
				append(slices.Clone(p), "0"), append(slices.Clone(p), "01"), append(slices.Clone(p), "-"),
				append(slices.Clone(p), "a"), append(slices.Clone(p), "nope"))
		}
		for _, tokens := range pointers {
			got, err := value(doc, tokens)
			checks++
			if err == nil {
				hits++
			}
			checkReference(t, doc, tokens, got, err)
		}
	}
	// The comparison means something only if many pointers hit a value.
	if hits < checks/20 {
		t.Errorf("only %d of %d pointers found a value", hits, checks)
	}
	t.Logf("%d pointers, %d found a value", checks, hits)
}

func FuzzJSONPointer(f *testing.F) {
	for _, s := range []struct{ doc, ptr string }{
		{rfc6901Doc, "/foo/1"},
		{rfc6901Doc, "/m~0n"},
		{rfc6901Doc, "/"},
		{rfc6901Doc, ""},
		{`"whole"`, ""},
		{`{"a":"first","\u0061":"second"}`, "/a"},
		{`{"a":{"b":[1,{"c":"\ud83d\ude00"}]}}`, "/a/b/1/c"},
		{`{"a":[10,20,30]}`, "/a/01"},
		{`{"a":[10,20,30]}`, "/a/-"},
		{`{"n":1E+3,"m":-0}`, "/n"},
		{"{\"\xff\":\"x\xc3\"}", "/\uFFFD"},
		{`{"a":"\ude00\ud83d\ud83d\u0041"}`, "/a"},
		{`{"k\"l":"x","k\\":"y"}`, "/k\\"},
		{stripeEvent, "/data/object/id"},
	} {
		f.Add([]byte(s.doc), s.ptr)
	}
	// And a few awkward documents from the generator, each with a pointer
	// to its deepest value.
	r := rand.New(rand.NewPCG(6901, 2))
	for range 8 {
		g := &jpGen{r: r}
		g.value(nil, 0)
		deepest := slices.MaxFunc(g.paths, func(a, b []string) int { return len(a) - len(b) })
		var ptr strings.Builder
		for _, tok := range deepest {
			ptr.WriteString("/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(tok))
		}
		f.Add(g.b, ptr.String())
	}
	f.Fuzz(func(t *testing.T, doc []byte, ptr string) {
		tokens, err := jsonpointer.Parse(ptr)
		if err != nil {
			return
		}
		// Never a panic, even on a document that is not JSON.
		got, err := value(doc, tokens)
		if !json.Valid(doc) {
			return
		}
		checkReference(t, doc, tokens, got, err)
	})
}

// validPointer is RFC 6901's grammar: *( "/" *( unescaped / "~0" / "~1" ) ).
var validPointer = regexp.MustCompile(`^(/([^~/]|~[01])*)*$`)

func FuzzParsePointer(f *testing.F) {
	for _, s := range []string{"", "/", "//", "/a~1b/m~0n", "/~01", "a", "/~", "/~2", "/é/\xff", "#/a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		tokens, err := jsonpointer.Parse(p)
		// regexp reads invalid UTF-8 as U+FFFD, which is neither ~ nor /.
		if valid := validPointer.MatchString(p); (err == nil) != valid {
			t.Fatalf("Parse(%q) error %v; grammar says valid=%v", p, err, valid)
		}
		if err != nil {
			return
		}
		// Escaping the tokens again gives back the pointer.
		var sb strings.Builder
		for _, tok := range tokens {
			sb.WriteByte('/')
			sb.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(tok))
		}
		if sb.String() != p {
			t.Fatalf("Parse(%q) = %q, which escapes back to %q", p, tokens, sb.String())
		}
	})
}

// stripeEvent is a Stripe-like webhook event of about 1 KiB.
const stripeEvent = `{
  "id": "evt_3PqR8sLkdIwHu7ix0vJ2mN4b",
  "object": "event",
  "api_version": "2024-06-20",
  "created": 1724154062,
  "data": {
    "object": {
      "id": "pi_3PqR8sLkdIwHu7ix0c1TzQ9e",
      "object": "payment_intent",
      "amount": 2000,
      "amount_capturable": 0,
      "amount_received": 2000,
      "capture_method": "automatic_async",
      "client_secret": "pi_3PqR8sLkdIwHu7ix0c1TzQ9e_secret_Wd1Xk2jNs8vQ",
      "confirmation_method": "automatic",
      "created": 1724154060,
      "currency": "eur",
      "customer": "cus_QhT3vB8mZk1sLp",
      "description": "Order #1042 \u2014 \"Caf\u00e9\" beans",
      "latest_charge": "ch_3PqR8sLkdIwHu7ix0Kq2Wv7s",
      "livemode": false,
      "metadata": {"order_id": "1042", "cart": "[\"sku_1\",\"sku_2\"]"},
      "payment_method": "pm_1PqR8rLkdIwHu7ixZ3bYk0qA",
      "payment_method_types": ["card", "link"],
      "status": "succeeded"
    },
    "previous_attributes": null
  },
  "livemode": false,
  "pending_webhooks": 2,
  "request": {"id": "req_Xy7Qw2Lm9NbVcT", "idempotency_key": "5f3c2a1e-7b9d-4e6f-a8c0-1d2b3e4f5a6b"},
  "type": "payment_intent.succeeded"
}`

func BenchmarkJSONPointer(b *testing.B) {
	doc := []byte(stripeEvent)
	for _, ptr := range []string{"/id", "/data/object/id"} {
		tokens, err := jsonpointer.Parse(ptr)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(strings.ReplaceAll(ptr[1:], "/", "."), func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := value(doc, tokens); err != nil {
					b.Fatal("not found")
				}
			}
		})
	}
	// For scale: the same extraction with encoding/json.
	b.Run("encoding-json.data.object.id", func(b *testing.B) {
		b.SetBytes(int64(len(doc)))
		b.ReportAllocs()
		for b.Loop() {
			var ev struct {
				Data struct {
					Object struct {
						ID string `json:"id"`
					} `json:"object"`
				} `json:"data"`
			}
			if err := json.Unmarshal(doc, &ev); err != nil || ev.Data.Object.ID == "" {
				b.Fatal(err)
			}
		}
	})
}
