package jcs

import (
	"crypto/sha256"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
)

// shape builds a document of about n bytes.
type shape struct {
	name  string
	build func(n int) []byte
}

// repeatTo repeats unit, separated by commas, between open and close, to
// about n bytes.
func repeatTo(n int, open, unit, close string) []byte {
	var b strings.Builder
	b.WriteString(open)
	for k := 0; b.Len()+len(unit)+len(close) < n; k++ {
		if k > 0 {
			b.WriteByte(',')
		}
		b.WriteString(unit)
	}
	b.WriteString(close)
	return []byte(b.String())
}

// names are distinct short member names, shortest first.
func names(n int, emit func(name string) bool) {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	for length := 1; ; length++ {
		idx := make([]int, length)
		for {
			var b strings.Builder
			for _, i := range idx {
				b.WriteByte(alphabet[i])
			}
			if !emit(b.String()) {
				return
			}
			k := length - 1
			for k >= 0 && idx[k] == len(alphabet)-1 {
				idx[k] = 0
				k--
			}
			if k < 0 {
				break
			}
			idx[k]++
		}
	}
}

// manyMembers is one object of distinct members, each value val, after
// prefix, to about n bytes.
func manyMembers(n int, prefix, val string) []byte {
	var b strings.Builder
	b.WriteByte('{')
	names(n, func(name string) bool {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + prefix + name + `":` + val)
		return b.Len() < n-40
	})
	b.WriteByte('}')
	return []byte(b.String())
}

var shapes = []shape{
	{"empty objects [{},{},...]", func(n int) []byte { return repeatTo(n, "[", "{}", "]") }},
	{"short members {\"a\":0,...}", func(n int) []byte { return manyMembers(n, "", "0") }},
	{"one-member objects [{\"\":0},...]", func(n int) []byte { return repeatTo(n, "[", `{"":0}`, "]") }},
	{"chains [{\"\":{\"\":...0}},...]", func(n int) []byte {
		depth := MaxDepth - 1
		chain := strings.Repeat(`{"":`, depth) + "0" + strings.Repeat("}", depth)
		if len(chain) > n {
			depth = n / 6
			chain = strings.Repeat(`{"":`, depth) + "0" + strings.Repeat("}", depth)
		}
		return repeatTo(n, "[", chain, "]")
	}},
	{"arrays nested to MaxDepth", func(n int) []byte {
		open, close := strings.Repeat("[", MaxDepth-1), strings.Repeat("]", MaxDepth-1)
		return append(append([]byte(open), repeatTo(n-len(open)-len(close), "[", "0", "]")...), close...)
	}},
	{"objects nested to MaxDepth", func(n int) []byte {
		open, close := strings.Repeat(`{"a":`, MaxDepth-1), strings.Repeat("}", MaxDepth-1)
		return append(append([]byte(open), manyMembers(n-len(open)-len(close), "", "0")...), close...)
	}},
	{"long escaped names", func(n int) []byte {
		return manyMembers(n, strings.Repeat(`\u0061\n`, 64), "[]")
	}},
	{"colons in strings", func(n int) []byte { return repeatTo(n, "[", `":::::::::::::::::::::"`, "]") }},
}

// allocated is the heap the allocator hands out per call of f: the least
// of a few averages, so that what the runtime or the test framework
// allocates now and then in the background is not counted against f.
func allocated(runs int, f func()) int {
	least := -1
	for trial := 0; trial < 3; trial++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for k := 0; k < runs; k++ {
			f()
		}
		runtime.ReadMemStats(&after)
		if n := int((after.TotalAlloc - before.TotalAlloc) / uint64(runs)); least < 0 || n < least {
			least = n
		}
	}
	return least
}

// TestScratchWithinBound measures what a call allocates with nothing to
// reuse, for the worst shapes of document, against ScratchBound and against
// what this document alone should take: allocation in proportion to the
// document beyond the counted spans (a copy of it, a tree) fails both for
// some shape.
func TestScratchWithinBound(t *testing.T) {
	sizes := []int{64 << 10, 1 << 20}
	if testing.Short() || raceEnabled { // the race detector makes the large ones slow, and measures nothing more
		sizes = sizes[:1]
	}
	for _, size := range sizes {
		for _, sh := range shapes {
			doc := sh.build(size)
			if err := Write(io.Discard, doc); err != nil {
				t.Fatalf("%s: %v", sh.name, err)
			}
			got := allocated(4, func() {
				s := new(state)
				s.out = sink{w: io.Discard, b: s.buf[:0]}
				if err := s.run(doc); err != nil {
					t.Fatal(err)
				}
			})
			want := Scratch(doc) // what the caller counts for this document
			bound := ScratchBound(len(doc))
			if want > bound {
				t.Errorf("%s, %d bytes: Scratch %d over ScratchBound %d", sh.name, len(doc), want, bound)
			}
			t.Logf("%7d bytes %-36s allocated %8d (%.2f×)  bound %8d (%.2f×)",
				len(doc), sh.name, got, float64(got)/float64(len(doc)), bound, float64(bound)/float64(len(doc)))
			if got > want+64 {
				t.Errorf("%s, %d bytes: allocated %d, want at most %d", sh.name, len(doc), got, want)
			}
			if got > bound {
				t.Errorf("%s, %d bytes: allocated %d, over ScratchBound %d", sh.name, len(doc), got, bound)
			}
		}
	}
}

// TestPooledScratch: a warm pool leaves nothing to allocate.
func TestPooledScratch(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items at random")
	}
	h := sha256.New()
	for _, sh := range shapes {
		doc := sh.build(64 << 10)
		if n := testing.AllocsPerRun(20, func() {
			h.Reset()
			if err := Write(h, doc); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations a call", sh.name, n)
		}
	}
	doc := realistic()
	if n := testing.AllocsPerRun(100, func() { Write(h, doc) }); n != 0 {
		t.Errorf("1 KiB body: %v allocations a call", n)
	}
}

func TestScratchBound(t *testing.T) {
	prev := 0
	for n := 0; n <= 4<<20; n += 997 {
		b := ScratchBound(n)
		if b < prev {
			t.Fatalf("ScratchBound(%d) = %d < ScratchBound(%d)", n, b, n-997)
		}
		if n >= 64<<10 && b > 2*n {
			t.Errorf("ScratchBound(%d) = %d, over twice the document", n, b)
		}
		prev = b
	}
}

// realistic is a 1 KiB request body of the kind keyed routes carry.
func realistic() []byte {
	var b strings.Builder
	b.WriteString(`{"type":"payment_intent","amount":129900,"currency":"eur","capture_method":"automatic",` +
		`"customer":{"id":"cus_9s6XKzkNRiz8i3","email":"jenny.rosen@example.com","name":"Jenny Rosen",` +
		`"address":{"line1":"510 Townsend St","city":"San Francisco","postal_code":"94103","country":"US"}},` +
		`"metadata":{"order_id":"6735","channel":"web","coupon":null,"gift":false},"items":[`)
	for k := 0; k < 4; k++ {
		if k > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"sku_%04d","description":"Caf\u00e9 cr\u00e8me \u2014 size %d","quantity":%d,"unit_price":%d.%02d,"tax_rate":0.2,"tags":["a","b"]}`, 1000+k, k, k+1, 10+k*7, k*13)
	}
	b.WriteString(`],"shipping":{"method":"express","cost":9.9,"eta_days":2},"description":"Order #6735 \"express\"\n",` +
		`"statement_descriptor":"EXAMPLE SHOP","confirm":true,"return_url":"https://example.com/orders/6735/complete?x=1&y=2"}`)
	return []byte(b.String())
}

func TestRealisticBody(t *testing.T) {
	doc := realistic()
	if len(doc) < 900 || len(doc) > 1200 {
		t.Fatalf("realistic body is %d bytes", len(doc))
	}
	canon(t, string(doc))
}
