package proxy

import (
	"testing"

	"github.com/gowebpki/jcs"
)

// TestJCSVectors checks the canonicaliser behind fingerprint=json against
// RFC 8785's own examples (sections 3.2.2 and 3.2.3, appendix B).
func TestJCSVectors(t *testing.T) {
	cases := []struct{ in, want string }{
		{ // 3.2.2: literals, numbers, strings
			`{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
			  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
			  "literals": [null, true, false]}`,
			`{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`,
		},
		{ // 3.2.3: property sorting by UTF-16 code units
			`{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
			  "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control",
			  "\u00f6": "Latin Small Letter O With Diaeresis"}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}",
		},
		// Appendix B: number serialisation.
		{`[-0]`, `[0]`},
		{`[1e21]`, `[1e+21]`},
		{`[1e20]`, `[100000000000000000000]`},
		{`[9007199254740992]`, `[9007199254740992]`},
		{`[0.000001]`, `[0.000001]`},
		{`[1e-7]`, `[1e-7]`},
		{`[295147905179352830000]`, `[295147905179352830000]`},
	}
	for _, c := range cases {
		got, err := jcs.Transform([]byte(c.in))
		if err != nil {
			t.Errorf("Transform(%s): %v", c.in, err)
			continue
		}
		if string(got) != c.want {
			t.Errorf("Transform(%s)\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}
