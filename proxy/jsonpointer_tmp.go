package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

// Temporary reference implementation, replaced by jsonpointer.go.

func parsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if !strings.HasPrefix(p, "/") {
		return nil, errors.New("a JSON pointer starts with /")
	}
	var out []string
	for t := range strings.SplitSeq(p[1:], "/") {
		if strings.Contains(strings.NewReplacer("~0", "", "~1", "").Replace(t), "~") {
			return nil, errors.New("~ must be followed by 0 or 1")
		}
		out = append(out, strings.NewReplacer("~1", "/", "~0", "~").Replace(t))
	}
	return out, nil
}

func jsonPointerValue(doc []byte, tokens []string) (string, bool) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return "", false
	}
	for _, t := range tokens {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[t]; !ok {
				return "", false
			}
		case []any:
			i, err := strconv.Atoi(t)
			if err != nil || i < 0 || i >= len(c) || (len(t) > 1 && t[0] == '0') {
				return "", false
			}
			v = c[i]
		default:
			return "", false
		}
	}
	switch c := v.(type) {
	case string:
		return c, true
	case json.Number:
		return string(c), true
	}
	return "", false
}
