package proxy

import (
	"errors"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		values  []string
		want    string
		wantErr string // substring; "" means no error
	}{
		{"bare token", []string{"abc-123_X"}, "abc-123_X", ""},
		{"stripe style", []string{"1795123_CoYaEw"}, "1795123_CoYaEw", ""},
		{"sf-string", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", ""},
		{"sf-string escapes", []string{`"a\"b\\c"`}, `a"b\c`, ""},
		{"surrounding spaces trimmed", []string{"  abc  "}, "abc", ""},
		{"visible punctuation", []string{"a!#$%&'*+.^`|~z"}, "a!#$%&'*+.^`|~z", ""},
		{"max length", []string{strings.Repeat("k", 40)}, strings.Repeat("k", 40), ""},
		{"absent", nil, "", "no key"},
		{"repeated header", []string{"a", "b"}, "", "2 times"},
		{"comma", []string{"a,b"}, "", "comma"},
		{"comma in sf-string", []string{`"a,b"`}, "", "comma"},
		{"empty", []string{""}, "", "empty"},
		{"empty sf-string", []string{`""`}, "", "empty"},
		{"too long", []string{strings.Repeat("k", 41)}, "", "limit is 40"},
		{"too long after unquoting counts unquoted", []string{`"` + strings.Repeat("k", 40) + `"`}, strings.Repeat("k", 40), ""},
		{"inner space", []string{"a b"}, "", "visible ASCII"},
		{"space in sf-string", []string{`"a b"`}, "", "visible ASCII"},
		{"non-ascii", []string{"ключ"}, "", "visible ASCII"},
		{"control char", []string{"a\x01b"}, "", "visible ASCII"},
		{"unterminated sf-string", []string{`"abc`}, "", "closing quote"},
		{"lone quote", []string{`"`}, "", "closing quote"},
		{"bad escape", []string{`"a\nb"`}, "", "backslash"},
		{"trailing backslash", []string{`"ab\"`}, "", "backslash"},
		{"unescaped inner quote", []string{`"a"b"`}, "", "unescaped quote"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseKey(tt.values, 40)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Errorf("parseKey(%q) = %q, %v; want %q", tt.values, got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseKey(%q) = %q, %v; want an error containing %q", tt.values, got, err, tt.wantErr)
			}
			if tt.values == nil && !errors.Is(err, errNoKey) {
				t.Errorf("absent key: got %v, want errNoKey", err)
			}
		})
	}
}

// FuzzParseKey: never panics; an accepted key is 1..max visible ASCII
// characters without a comma.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\b"`, `"`, `""`, "a,b", " ", "\x00", `"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := parseKey([]string{v}, 64)
		if err != nil {
			return
		}
		if key == "" || len(key) > 64 || strings.ContainsAny(key, ", ") {
			t.Fatalf("parseKey(%q) accepted %q", v, key)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				t.Fatalf("parseKey(%q) accepted %q with byte %#x", v, key, key[i])
			}
		}
	})
}
