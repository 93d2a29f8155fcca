package jcs

import (
	"strconv"
)

// numberFitsDouble reports whether the number literal n (valid JSON) has at
// most 15 significant digits and a decimal magnitude within about ±300. Such
// decimals map to distinct doubles, all normal, so equal canonical forms mean
// equal numbers. It is the rule of numbersFitDoubles in proxy/fingerprint.go,
// moved here, with one change: the exponent is read in full (saturating far
// beyond any magnitude that a document's fraction digits could cancel)
// rather than cut off after six digits, so that the magnitude checked is the
// magnitude parsed.
func numberFitsDouble(n []byte) bool {
	digits, fracDigits, exp := numberParts(n)
	if digits == 0 {
		return true // zero, however written
	}
	mag := exp - fracDigits + int64(digits) // decimal magnitude of the leading digit, roughly
	return digits <= 15 && mag > -300 && mag < 300
}

// numberParts splits a number literal into the count of its significant
// digits (trailing zeros included), of its fraction digits, and its
// exponent.
func numberParts(n []byte) (digits int, fracDigits, exp int64) {
	lead, seenDot := true, false
	i := 0
	for ; i < len(n) && n[i] != 'e' && n[i] != 'E'; i++ {
		switch c := n[i]; {
		case c == '.':
			seenDot = true
		case isDigit(c):
			if seenDot {
				fracDigits++
			}
			if lead && c == '0' {
				continue
			}
			lead = false
			digits++
		}
	}
	if i < len(n) {
		neg := false
		for _, c := range n[i+1:] {
			switch {
			case c == '-':
				neg = true
			case isDigit(c) && exp < 1<<40:
				exp = exp*10 + int64(c-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	return digits, fracDigits, exp
}

// appendNumber appends the canonical form of the number literal n, which
// validate accepted.
func appendNumber(dst, n []byte) []byte {
	if isInteger(n) {
		// At most 15 digits (validate saw to it), so the double is exact and
		// below 1e21, and ECMAScript writes it as the literal is written.
		if len(n) == 2 && n[0] == '-' && n[1] == '0' {
			return append(dst, '0')
		}
		return append(dst, n...)
	}
	// The literal is restated as at most 15 digits and a small exponent, so
	// that ParseFloat reads a short string off the stack (a literal may
	// carry any number of leading or trailing zeros).
	var tmp [32]byte
	d := tmp[:0]
	if n[0] == '-' {
		d = append(d, '-')
	}
	lead := true
	i := 0
	for ; i < len(n) && n[i] != 'e' && n[i] != 'E'; i++ {
		if c := n[i]; isDigit(c) && !(lead && c == '0') {
			lead = false
			d = append(d, c)
		}
	}
	if lead {
		return append(dst, '0')
	}
	_, fracDigits, exp := numberParts(n)
	d = append(d, 'e')
	d = strconv.AppendInt(d, exp-fracDigits, 10)
	f, err := strconv.ParseFloat(string(d), 64)
	if err != nil { // not after numberFitsDouble; written as something valid regardless
		return append(dst, '0')
	}
	return appendDouble(dst, f)
}

func isInteger(n []byte) bool {
	for _, c := range n {
		if c == '.' || c == 'e' || c == 'E' {
			return false
		}
	}
	return true
}

// appendDouble appends f as ECMAScript's Number.prototype.toString writes it
// (RFC 8785 section 3.2.2.3), as github.com/gowebpki/jcs's NumberToJSON does,
// without allocating. f is finite.
func appendDouble(dst []byte, f float64) []byte {
	if f == 0 { // -0 too
		return append(dst, '0')
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	if f >= 1e-6 && f < 1e21 {
		return strconv.AppendFloat(dst, f, 'f', -1, 64)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'e', -1, 64)
	// Go writes at least two exponent digits (1e+09), ECMAScript as many as
	// it takes (1e+9).
	for e := start; e < len(dst); e++ {
		if dst[e] == 'e' {
			if dst[e+2] == '0' {
				dst = append(dst[:e+2], dst[e+3:]...)
			}
			break
		}
	}
	return dst
}
