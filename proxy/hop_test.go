package proxy

import (
	"net/http"
	"reflect"
	"testing"
)

func TestRecordableHeader(t *testing.T) {
	t.Parallel()
	in := http.Header{
		"Connection":        {"keep-alive, X-Hop-One", "x-hop-two"},
		"Keep-Alive":        {"timeout=5"},
		"Transfer-Encoding": {"chunked"},
		"Upgrade":           {"h2c"},
		"Trailer":           {"X-Sum"},
		"Te":                {"trailers"},
		"Proxy-Connection":  {"keep-alive"},
		"X-Hop-One":         {"1"},
		"X-Hop-Two":         {"2"},
		"Trailer:X-Sum":     {"abc"},
		"Set-Cookie":        {"a=1", "b=2"},
		"Content-Type":      {"application/json"},
		"Location":          {"/orders/1"},
	}
	want := map[string][]string{
		"Set-Cookie":   {"a=1", "b=2"},
		"Content-Type": {"application/json"},
		"Location":     {"/orders/1"},
	}
	if got := recordableHeader(in); !reflect.DeepEqual(got, want) {
		t.Errorf("recordableHeader: got %v, want %v", got, want)
	}
	dst := http.Header{}
	copyRecordable(dst, in)
	if !reflect.DeepEqual(map[string][]string(dst), want) {
		t.Errorf("copyRecordable: got %v, want %v", dst, want)
	}
}
