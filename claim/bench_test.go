package claim

import (
	"testing"
)

func benchRecord() *Record {
	body := make([]byte, 200)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	return &Record{Status: 201, Header: map[string][]string{
		"Content-Type":   {"application/json"},
		"Content-Length": {"200"},
		"Date":           {"Sun, 22 Nov 2026 00:47:57 GMT"},
		"Location":       {"/orders/1"},
	}, Body: body}
}

func BenchmarkRecordEncode(b *testing.B) {
	rec := benchRecord()
	b.ReportAllocs()
	for b.Loop() {
		_ = rec.Encode()
	}
}

func BenchmarkRecordDecode(b *testing.B) {
	enc := benchRecord().Encode()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRecord(enc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeReply(b *testing.B) {
	v := []any{"replay", string(benchRecord().Encode())}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := decodeReply(v, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewKey(b *testing.B) {
	scope := []string{"Bearer sk_test_0123456789abcdef"}
	b.ReportAllocs()
	for b.Loop() {
		_ = NewKey(scope, "8e03978e-40d5-43e8-bc93-6894a57f9324")
	}
}
