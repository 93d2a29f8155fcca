package jcs

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/gowebpki/jcs"
)

// es6Vectors are IEEE-754 doubles and their ECMAScript form: RFC 8785
// Appendix B (NaN and Infinity left out: JSON has no literal for them),
// and the cases of github.com/gowebpki/jcs v1.0.2's es6numfmt_test.go.
var es6Vectors = []struct{ bits, want string }{
	{"0000000000000000", "0"},
	{"8000000000000000", "0"},
	{"0000000000000001", "5e-324"},
	{"8000000000000001", "-5e-324"},
	{"7fefffffffffffff", "1.7976931348623157e+308"},
	{"ffefffffffffffff", "-1.7976931348623157e+308"},
	{"4340000000000000", "9007199254740992"},
	{"c340000000000000", "-9007199254740992"},
	{"4430000000000000", "295147905179352830000"},
	{"44b52d02c7e14af5", "9.999999999999997e+22"},
	{"44b52d02c7e14af6", "1e+23"},
	{"44b52d02c7e14af7", "1.0000000000000001e+23"},
	{"444b1ae4d6e2ef4e", "999999999999999700000"},
	{"444b1ae4d6e2ef4f", "999999999999999900000"},
	{"444b1ae4d6e2ef50", "1e+21"},
	{"3eb0c6f7a0b5ed8c", "9.999999999999997e-7"},
	{"3eb0c6f7a0b5ed8d", "0.000001"},
	{"41b3de4355555553", "333333333.3333332"},
	{"41b3de4355555554", "333333333.33333325"},
	{"41b3de4355555555", "333333333.3333333"},
	{"41b3de4355555556", "333333333.3333334"},
	{"41b3de4355555557", "333333333.33333343"},
	{"becbf647612f3696", "-0.0000033333333333333333"},
	{"43143ff3c1cb0959", "1424953923781206.2"},
	// es6numfmt_test.go
	{"4340000000000001", "9007199254740994"},
	{"4340000000000002", "9007199254740996"},
}

func TestAppendDoubleVectors(t *testing.T) {
	for _, v := range es6Vectors {
		u, err := strconv.ParseUint(v.bits, 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		f := math.Float64frombits(u)
		if got := string(appendDouble(nil, f)); got != v.want {
			t.Errorf("%s: got %s, want %s", v.bits, got, v.want)
		}
		if ref, err := jcs.NumberToJSON(f); err != nil || ref != v.want {
			t.Errorf("%s: NumberToJSON gives %s, %v", v.bits, ref, err)
		}
	}
}

// TestAppendDoubleMatchesNumberToJSON: appendDouble is NumberToJSON
// without its allocations, over random doubles of every magnitude.
func TestAppendDoubleMatchesNumberToJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	n := 300000
	if testing.Short() {
		n = 20000
	}
	var buf []byte
	for k := 0; k < n; k++ {
		var f float64
		switch k % 3 {
		case 0:
			f = math.Float64frombits(r.Uint64())
		case 1: // near the 'f'/'e' switches and powers of ten
			f = math.Pow(10, float64(r.IntN(60)-30)) * (1 + (r.Float64()-0.5)*1e-15)
		default: // short decimals, as documents carry
			f, _ = strconv.ParseFloat(strconv.FormatInt(r.Int64N(1e15), 10)+"e"+strconv.Itoa(r.IntN(600)-300), 64)
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		want, err := jcs.NumberToJSON(f)
		if err != nil {
			t.Fatal(err)
		}
		buf = appendDouble(buf[:0], f)
		if string(buf) != want {
			t.Fatalf("%x (%v): got %s, want %s", math.Float64bits(f), f, buf, want)
		}
	}
}

// TestNumberLiterals: literals within the rule canonicalise as
// gowebpki/jcs canonicalises them, however they are written.
func TestNumberLiterals(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for k := 0; k < 50000; k++ {
		lit := randomLiteral(r)
		want, werr := jcs.Transform([]byte(lit))
		got, err := Append(nil, []byte(lit))
		if err != nil {
			if !numberFitsDouble([]byte(lit)) {
				continue
			}
			t.Fatalf("%s: %v", lit, err)
		}
		if werr != nil || string(got) != string(want) {
			t.Fatalf("%s: got %s, gowebpki %s (%v)", lit, got, want, werr)
		}
	}
}

func randomLiteral(r *rand.Rand) string {
	var b []byte
	if r.IntN(2) == 0 {
		b = append(b, '-')
	}
	digits := func(n int, first bool) {
		for i := 0; i < n; i++ {
			d := byte('0' + r.IntN(10))
			if first && i == 0 && d == '0' {
				d = '1'
			}
			b = append(b, d)
		}
	}
	if r.IntN(3) == 0 {
		b = append(b, '0')
	} else {
		digits(1+r.IntN(16), true)
	}
	if r.IntN(2) == 0 {
		b = append(b, '.')
		digits(1+r.IntN(18), false)
	}
	if r.IntN(2) == 0 {
		b = append(b, "eE"[r.IntN(2)])
		if s := r.IntN(3); s < 2 {
			b = append(b, "+-"[s])
		}
		b = strconv.AppendInt(b, int64(r.IntN(330)), 10)
	}
	return string(b)
}

func TestNumberFitsDouble(t *testing.T) {
	for _, c := range []struct {
		lit string
		ok  bool
	}{
		{"0", true}, {"-0", true}, {"0.000e-99999", true}, {"0e999999999999999999", true},
		{"123456789012345", true}, {"1234567890123456", false},
		{"1.23456789012345", true}, {"1.234567890123456", false},
		{"0.000000000000000000000000000000123456789012345", true},
		{"100000000000000", true}, {"1000000000000000", false},
		{"1e298", true}, {"1e299", false}, {"9.99e298", true},
		{"1e-299", true}, {"1e-300", true}, {"1e-301", false},
		{"1e400", false}, {"1e-400", false},
		// An exponent of more than six digits is read in full.
		{"1e0000000000000000000000000000005", true},
		{"1e1000005", false},
		{"1e99999999999999999999999999999999", false},
		{"1e-99999999999999999999999999999999", false},
	} {
		if got := numberFitsDouble([]byte(c.lit)); got != c.ok {
			t.Errorf("%s: %v, want %v", c.lit, got, c.ok)
		}
	}
}
