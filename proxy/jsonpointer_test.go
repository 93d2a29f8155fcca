package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
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
		got, err := parsePointer(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parsePointer(%q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) || (tc.want == nil) != (len(got) == 0) {
			t.Errorf("parsePointer(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
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
	}{
		// RFC 6901 section 5; only strings and numbers are values here.
		{"rfc whole", rfc6901Doc, "", "", false},
		{"rfc foo", rfc6901Doc, "/foo", "", false},
		{"rfc foo/0", rfc6901Doc, "/foo/0", "bar", true},
		{"rfc foo/1", rfc6901Doc, "/foo/1", "baz", true},
		{"rfc empty name", rfc6901Doc, "/", "0", true},
		{"rfc a/b", rfc6901Doc, "/a~1b", "1", true},
		{"rfc c%d", rfc6901Doc, "/c%d", "2", true},
		{"rfc e^f", rfc6901Doc, "/e^f", "3", true},
		{"rfc g|h", rfc6901Doc, "/g|h", "4", true},
		{"rfc i\\j", rfc6901Doc, `/i\j`, "5", true},
		{"rfc k\"l", rfc6901Doc, `/k"l`, "6", true},
		{"rfc space", rfc6901Doc, "/ ", "7", true},
		{"rfc m~n", rfc6901Doc, "/m~0n", "8", true},
		{"rfc unescaped a/b is two tokens", rfc6901Doc, "/a/b", "", false},
		{"rfc foo/2", rfc6901Doc, "/foo/2", "", false},

		// The whole document.
		{"whole string", `"abc"`, "", "abc", true},
		{"whole number", ` 42 `, "", "42", true},
		{"whole null", `null`, "", "", false},
		{"whole array", `[1]`, "", "", false},

		// Nested paths.
		{"nested id", nested, "/data/object/id", "pi_1", true},
		{"top id after nested", nested, "/id", "evt_1", true},
		{"nested number", nested, "/data/object/amount", "2000", true},
		{"deep array", nested, "/data/object/obj/deep/0/x", "y", true},
		{"object not a value", nested, "/data/object", "", false},
		{"missing member", nested, "/data/object/nope", "", false},
		{"missing top", nested, "/nope/id", "", false},
		{"through a string", nested, "/id/0", "", false},
		{"through a number", nested, "/data/object/amount/x", "", false},
		{"index on object", nested, "/data/0", "", false},
		{"name on array", nested, "/data/object/obj/deep/x", "", false},
		{"prefix of a name", nested, "/dat", "", false},
		{"longer than a name", nested, "/datas", "", false},

		// Escapes in names and values.
		{"value \\n", `{"a":"x\ny"}`, "/a", "x\ny", true},
		{"value all short escapes", `{"a":"\"\\\/\b\f\n\r\t"}`, "/a", "\"\\/\b\f\n\r\t", true},
		{"value \\u00e9", `{"a":"caf\u00e9"}`, "/a", "café", true},
		{"value \\u00E9 upper hex", `{"a":"caf\u00E9"}`, "/a", "café", true},
		{"value raw é", `{"a":"café"}`, "/a", "café", true},
		{"value surrogate pair", `{"a":"\ud83d\ude00!"}`, "/a", "😀!", true},
		{"value lone high surrogate", `{"a":"\ud83dx"}`, "/a", "\uFFFDx", true},
		{"value lone low surrogate", `{"a":"\ude00"}`, "/a", "\uFFFD", true},
		{"value reversed pair", `{"a":"\ude00\ud83d"}`, "/a", "\uFFFD\uFFFD", true},
		{"value high then BMP escape", `{"a":"\ud83d\u0041"}`, "/a", "\uFFFDA", true},
		{"value invalid UTF-8", "{\"a\":\"x\xffy\xe2\x82\"}", "/a", "x\uFFFDy\uFFFD\uFFFD", true},
		{"value \\u0000", `{"a":"\u0000"}`, "/a", "\x00", true},
		{"value escaped quote then more", `{"a":"\"","b":"c"}`, "/b", "c", true},
		{"value ends in backslash", `{"a":"x\\","b":"c"}`, "/a", `x\`, true},
		{"name escaped", `{"\u0061":"x"}`, "/a", "x", true},
		{"name escaped slash", `{"a\/b":"x"}`, "/a~1b", "x", true},
		{"name escaped é", `{"caf\u00e9":"x"}`, "/café", "x", true},
		{"name raw é", `{"café":"x"}`, "/café", "x", true},
		{"name surrogate pair", `{"\ud83d\ude00":"x"}`, "/😀", "x", true},
		{"name lone surrogate", `{"\ud83d":"x"}`, "/\uFFFD", "x", true},
		{"name invalid UTF-8", "{\"\xff\":\"x\"}", "/\uFFFD", "x", true},
		{"name invalid UTF-8 not as bytes", "{\"\xff\":\"x\"}", "/\xff", "", false},
		{"name with escaped quote skipped", `{"k\"l":"x","k":"y"}`, "/k", "y", true},
		{"name with backslash pair", `{"a\\":"x"}`, `/a\`, "x", true},
		{"name long escaped", `{"` + strings.Repeat(`\u0061`, 200) + `":"x"}`, "/" + strings.Repeat("a", 200), "x", true},
		{"value long escaped", `{"a":"` + strings.Repeat(`\u00e9`, 200) + `"}`, "/a", strings.Repeat("é", 200), true},

		// Numbers are kept as written.
		{"number 1.50", `{"n":1.50}`, "/n", "1.50", true},
		{"number -0", `{"n":-0}`, "/n", "-0", true},
		{"number 1E+3", `{"n":1E+3}`, "/n", "1E+3", true},
		{"number 1e3", `{"n":1e3}`, "/n", "1e3", true},
		{"number -1.5e-10", `{"n":-1.5e-10,"m":1}`, "/n", "-1.5e-10", true},
		{"number huge", `{"n":123456789012345678901234567890}`, "/n", "123456789012345678901234567890", true},
		{"number in array", `[0.10]`, "/0", "0.10", true},

		// Wrong types at the end.
		{"true", `{"a":true}`, "/a", "", false},
		{"false", `{"a":false}`, "/a", "", false},
		{"null", `{"a":null}`, "/a", "", false},
		{"empty object", `{"a":{}}`, "/a", "", false},
		{"empty array", `{"a":[]}`, "/a", "", false},

		// Whitespace everywhere.
		{"spaced array 1", spaced, "/a/1", "two", true},
		{"spaced number", spaced, "/a/2/b", "-0.5e-3", true},
		{"spaced first", spaced, "/a/0", "1", true},
		{"spaced last", spaced, "/c", "d", true},

		// Duplicates: the last one wins.
		{"duplicate", `{"a":"first","a":"second"}`, "/a", "second", true},
		{"duplicate escaped spelling", `{"a":"first","\u0061":"second"}`, "/a", "second", true},
		{"duplicate three", `{"a":1,"b":2,"a":3,"c":4,"a":5,"d":6}`, "/a", "5", true},
		{"duplicate last is not a value", `{"a":"x","a":null}`, "/a", "", false},
		{"duplicate last is object", `{"a":"x","a":{"b":"y"}}`, "/a/b", "y", true},
		{"duplicate first object dropped", `{"a":{"b":"y"},"a":{"c":"z"}}`, "/a/b", "", false},
		{"duplicate nested", `{"o":{"id":"1","id":"2"},"o":{"x":0,"id":"3","id":"4"}}`, "/o/id", "4", true},

		// Arrays.
		{"index 0", `["a","b"]`, "/0", "a", true},
		{"index 1", `["a","b"]`, "/1", "b", true},
		{"index out of range", `["a","b"]`, "/2", "", false},
		{"index on empty", `[]`, "/0", "", false},
		{"index leading zero", `["a","b"]`, "/01", "", false},
		{"index 00", `["a"]`, "/00", "", false},
		{"index -", `["a","b"]`, "/-", "", false},
		{"index negative", `["a","b"]`, "/-1", "", false},
		{"index plus", `["a","b"]`, "/+1", "", false},
		{"index empty", `["a","b"]`, "/", "", false},
		{"index space", `["a","b"]`, "/ 1", "", false},
		{"index hex", `["a","b"]`, "/0x1", "", false},
		{"index huge", `["a","b"]`, "/99999999999999999999999999", "", false},
		{"index 12", `[0,1,2,3,4,5,6,7,8,9,10,11,"twelve"]`, "/12", "twelve", true},
		{"index skips containers", `[{"a":[1,{"]":"["}]},[[]],"x"]`, "/2", "x", true},
		{"index skips literals", `[true,false,null,-1.5,"x"]`, "/4", "x", true},

		// Deep nesting.
		{"deep", deep, deepPtr, "bottom", true},
		{"deep one short", deep, deepPtr[:len(deepPtr)-2], "", false},
		{"deep skipped", `{"s":` + deep + `,"t":"x"}`, "/t", "x", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tokens, err := parsePointer(tc.ptr)
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid([]byte(tc.doc)) {
				t.Fatalf("test document is not valid JSON: %s", tc.doc)
			}
			got, ok := jsonPointerValue([]byte(tc.doc), tokens)
			if got != tc.want || ok != tc.ok {
				t.Errorf("jsonPointerValue(%s, %q) = %q, %v; want %q, %v", tc.doc, tc.ptr, got, ok, tc.want, tc.ok)
			}
			// The table agrees with encoding/json too.
			if want, wok := refPointerValue(t, []byte(tc.doc), tokens); want != tc.want || wok != tc.ok {
				t.Errorf("encoding/json reference gives %q, %v; the table says %q, %v", want, wok, tc.want, tc.ok)
			}
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
			tokens, _ := parsePointer(ptr)
			jsonPointerValue([]byte(doc), tokens)
		}
	}
}

// refPointerValue is jsonPointerValue done with encoding/json: decode the
// whole document (numbers as json.Number) and walk the tree.
func refPointerValue(t testing.TB, doc []byte, tokens []string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("encoding/json cannot decode a document json.Valid accepts: %v\n%q", err, doc)
	}
	for _, tok := range tokens {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[tok]; !ok {
				return "", false
			}
		case []any:
			n, err := strconv.Atoi(tok)
			if err != nil || n < 0 || n >= len(x) || strconv.Itoa(n) != tok {
				return "", false
			}
			v = x[n]
		default:
			return "", false
		}
	}
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return string(x), true
	}
	return "", false
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
		tokens, err := parsePointer(tc.ptr)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := jsonPointerValue(doc, tokens); ok != (tc.want == 1) {
			t.Fatalf("%s: ok = %v", tc.ptr, ok)
		}
		if got := testing.AllocsPerRun(100, func() { jsonPointerValue(doc, tokens) }); got != tc.want {
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
			got, ok := jsonPointerValue(doc, tokens)
			want, wok := refPointerValue(t, doc, tokens)
			checks++
			if ok {
				hits++
			}
			if got != want || ok != wok {
				t.Fatalf("document %q pointer %q: got %q, %v; encoding/json gives %q, %v", doc, tokens, got, ok, want, wok)
			}
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
		tokens, err := parsePointer(ptr)
		if err != nil {
			return
		}
		// Never a panic, even on a document that is not JSON.
		got, ok := jsonPointerValue(doc, tokens)
		if !json.Valid(doc) {
			return
		}
		if want, wok := refPointerValue(t, doc, tokens); got != want || ok != wok {
			t.Fatalf("document %q pointer %q: got %q, %v; encoding/json gives %q, %v", doc, ptr, got, ok, want, wok)
		}
	})
}

// validPointer is RFC 6901's grammar: *( "/" *( unescaped / "~0" / "~1" ) ).
var validPointer = regexp.MustCompile(`^(/([^~/]|~[01])*)*$`)

func FuzzParsePointer(f *testing.F) {
	for _, s := range []string{"", "/", "//", "/a~1b/m~0n", "/~01", "a", "/~", "/~2", "/é/\xff", "#/a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		tokens, err := parsePointer(p)
		// regexp reads invalid UTF-8 as U+FFFD, which is neither ~ nor /.
		if valid := validPointer.MatchString(p); (err == nil) != valid {
			t.Fatalf("parsePointer(%q) error %v; grammar says valid=%v", p, err, valid)
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
			t.Fatalf("parsePointer(%q) = %q, which escapes back to %q", p, tokens, sb.String())
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
		tokens, err := parsePointer(ptr)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(strings.ReplaceAll(ptr[1:], "/", "."), func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := jsonPointerValue(doc, tokens); !ok {
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
