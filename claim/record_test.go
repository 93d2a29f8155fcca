package claim

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	tests := []struct {
		name string
		rec  Record
	}{
		{"minimal", Record{Status: 204}},
		{"headers and body", Record{Status: 201, Header: map[string][]string{
			"Content-Type": {"application/json"},
			"Set-Cookie":   {"a=1; Path=/", "b=2"},
			"X-Empty":      {""},
		}, Body: []byte(`{"id":1}`)}},
		{"binary body", Record{Status: 200, Body: binary}},
		{"body not stored", Record{Status: 200, BodyNotStored: true, Header: map[string][]string{"Location": {"/x"}}}},
		{"status 999", Record{Status: 999}},
		{"trailers", Record{Status: 200, Header: map[string][]string{"Trailer": {"Grpc-Status"}},
			Body: []byte("x"), Trailer: map[string][]string{"Grpc-Status": {"0"}, "X-Checksum": {"abc"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeRecord(tt.rec.Encode())
			if err != nil {
				t.Fatalf("DecodeRecord: %v", err)
			}
			if !reflect.DeepEqual(*got, tt.rec) {
				t.Errorf("got %+v, want %+v", *got, tt.rec)
			}
		})
	}
}

func TestRecordEncodeIsDeterministic(t *testing.T) {
	rec := Record{Status: 200, Header: map[string][]string{"A": {"1"}, "B": {"2"}, "C": {"3"}, "D": {"4"}}}
	first := rec.Encode()
	for range 20 {
		if got := rec.Encode(); !bytes.Equal(got, first) {
			t.Fatalf("encoding differs between calls: %x vs %x", got, first)
		}
	}
}

func TestDecodeRecordRejects(t *testing.T) {
	good := (&Record{Status: 200, Header: map[string][]string{"A": {"b"}}, Body: []byte("hi")}).Encode()
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"short", []byte{'I', 1}},
		{"bad magic", append([]byte{'X'}, good[1:]...)},
		{"bad version", append([]byte{'I', 2}, good[2:]...)},
		{"unknown flag", append([]byte{'I', 1, 0x80}, good[3:]...)},
		{"status 0", []byte{'I', 1, 0, 0, 0, 0}},
		{"status 99", []byte{'I', 1, 0, 99, 0, 0}},
		{"truncated body", good[:len(good)-1]},
		{"trailing byte", append(append([]byte{}, good...), 0)},
		{"huge header count", []byte{'I', 1, 0, 200, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"huge body length", []byte{'I', 1, 0, 200, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"empty header name", []byte{'I', 1, 0, 200, 1, 1, 0, 0, 0}},
		{"duplicate header", []byte{'I', 1, 0, 200, 1, 2, 1, 'A', 0, 1, 'A', 0, 0}},
		{"unsorted headers", []byte{'I', 1, 0, 200, 1, 2, 1, 'B', 0, 1, 'A', 0, 0}},
		{"non-minimal varint", []byte{'I', 1, 0, 200, 1, 0x80, 0x00, 0}},
		{"unterminated varint", []byte{'I', 1, 0, 0x80}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if rec, err := DecodeRecord(tt.in); err == nil {
				t.Errorf("DecodeRecord(%x) = %+v, want an error", tt.in, rec)
			}
		})
	}
}

// FuzzDecodeRecord: arbitrary bytes never panic, and whatever decodes
// re-encodes to the same bytes (so garbage is never taken for a record).
func FuzzDecodeRecord(f *testing.F) {
	f.Add((&Record{Status: 200, Header: map[string][]string{"A": {"b", "c"}}, Body: []byte("hi")}).Encode())
	f.Add((&Record{Status: 500, BodyNotStored: true}).Encode())
	f.Add([]byte{})
	f.Add([]byte("I\x01\x00"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rec, err := DecodeRecord(in)
		if err != nil {
			return
		}
		if out := rec.Encode(); !bytes.Equal(out, in) {
			t.Fatalf("decoded %x to %+v, which encodes to %x", in, rec, out)
		}
	})
}

// TestTraceContextStored: Complete stores a Record.Trace only when it is a
// trace context (32 and 16 lower-case hex digits, joined by '-').
func TestTraceContextStored(t *testing.T) {
	for s, want := range map[string]bool{
		"4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7": true,
		"": false,
		"4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7":  false,
		"4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7":  false,
		"4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b":   false,
		"4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7x": false,
		"4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7":  false,
	} {
		if got := isTraceContext(s); got != want {
			t.Errorf("isTraceContext(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestReplayedOffset: a string record's replay is its whole string and the
// 1-based position of the answer in it; a position outside the string is a
// bad record, never a slice panic.
func TestReplayedOffset(t *testing.T) {
	for _, tc := range []struct {
		rec, at, want string
		bad           bool
	}{
		{"answer", "", "answer", false},        // a hash record: whole
		{"R2headANSWER", "7", "ANSWER", false}, // a string record: from the offset
		{"R2head", "7", "", false},             // the end: empty (DecodeRecord refuses it)
		{"R2head", "8", "", true},              // past the end
		{"R2head", "0", "", true},              // 1-based
		{"R2head", "-1", "", true},
		{"R2head", "x", "", true},
	} {
		got, err := replayed([4]string{tc.rec, "1000", "", tc.at})
		if got != tc.want || (err != nil) != tc.bad || (err != nil && !errors.Is(err, ErrBadRecord)) {
			t.Errorf("replayed(%q, offset %q) = %q, %v; want %q, bad %v", tc.rec, tc.at, got, err, tc.want, tc.bad)
		}
	}
}

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
