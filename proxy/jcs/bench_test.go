package jcs

import (
	"crypto/sha256"
	"io"
	"testing"

	"github.com/gowebpki/jcs"
)

// BenchmarkWrite compares Write with github.com/gowebpki/jcs's Transform,
// which it replaces, on the same documents:
//
//	go test -run '^$' -bench BenchmarkWrite -benchmem ./proxy/jcs/
func BenchmarkWrite(b *testing.B) {
	docs := []struct {
		name string
		doc  []byte
	}{
		{"1KiB-body", realistic()},
		{"63KB-empty-objects", repeatTo(63000, "[", "{}", "]")},
		{"64KiB-members", manyMembers(64<<10, "", "0")},
		{"64KiB-nested-objects", shapes[5].build(64 << 10)},
	}
	for _, d := range docs {
		b.Run(d.name+"/jcs.Write", func(b *testing.B) {
			b.SetBytes(int64(len(d.doc)))
			b.ReportAllocs()
			for b.Loop() {
				if err := Write(io.Discard, d.doc); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(d.name+"/jcs.Write+sha256", func(b *testing.B) {
			h := sha256.New()
			b.SetBytes(int64(len(d.doc)))
			b.ReportAllocs()
			for b.Loop() {
				h.Reset()
				if err := Write(h, d.doc); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(d.name+"/gowebpki.Transform", func(b *testing.B) {
			b.SetBytes(int64(len(d.doc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := jcs.Transform(d.doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
