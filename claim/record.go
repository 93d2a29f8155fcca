package claim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Record is a recorded upstream answer.
type Record struct {
	Status int
	// Header holds the end-to-end response headers (hop-by-hop ones already
	// removed by the caller); the type is http.Header's, without importing it.
	Header map[string][]string
	Body   []byte
	// Trailer holds the response trailers, sent after the body.
	Trailer map[string][]string
	// BodyNotStored marks a response whose body was too large (or streaming)
	// to be kept: a replay answers with the status and an explanation.
	BodyNotStored bool
	// Trace is the trace context of the execution that recorded the answer,
	// "<trace-id>-<span-id>" in lower-case hex (32 and 16 digits), or ""
	// (tracing off, or not sampled). It is not part of the encoding: Complete
	// stores it beside the record (field tr), and Acquire returns it with a
	// replay, so records read the same by every version. Complete stores
	// nothing else: any other value is dropped, and the answer recorded
	// without it.
	Trace string
	// Cached is set when the replay cache keeps the record (before any
	// other request can get it): its memory is the cache's, shared by every
	// replay of it, not the replaying request's own, and the request holds
	// it until Release. Not encoded.
	Cached bool
	pin    *cacheEntry // the cache entry that Release lets go of (Cached)
}

// Release ends the hold of a request on a record that Store.Acquire
// returned from, or into, the replay cache (Cached): the cache counts the
// record in REPLAY_CACHE_BYTES until every request that replays it has
// released it, even once it has left the cache. Call it once per record
// Acquire returned, when the answer has been written; it does nothing for
// a nil record or one not cached.
func (r *Record) Release() {
	if r != nil && r.pin != nil {
		r.pin.c.release(r.pin)
	}
}

// The encoding is binary so bodies are stored as bytes, not base64:
//
//	magic 'I', version 1, flags byte (bit 0: body not stored; bit 1: trailers)
//	uvarint status
//	uvarint header count, then per header: name (uvarint len + bytes),
//	  uvarint value count, values (uvarint len + bytes)
//	uvarint body length, body bytes
//	with bit 1 only: the trailers, encoded as the headers
//
// and nothing after. Records without trailers encode exactly as before bit 1
// existed, so older versions still read them.
const (
	recordMagic   = 'I'
	recordVersion = 1
	flagNoBody    = 1 << 0
	flagTrailers  = 1 << 1
)

var errBadRecord = errors.New("claim: malformed record")

// Encode returns the binary form of r. Header names are written in sorted
// order so equal records encode equally.
func (r *Record) Encode() []byte {
	size := 3 + binary.MaxVarintLen64*4 + len(r.Body) + headerSize(r.Header) + headerSize(r.Trailer)
	b := make([]byte, 0, size)
	var flags byte
	if r.BodyNotStored {
		flags |= flagNoBody
	}
	if len(r.Trailer) > 0 {
		flags |= flagTrailers
	}
	b = append(b, recordMagic, recordVersion, flags)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = appendHeader(b, r.Header)
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	b = append(b, r.Body...)
	if len(r.Trailer) > 0 {
		b = appendHeader(b, r.Trailer)
	}
	return b
}

func headerSize(h map[string][]string) int {
	size := binary.MaxVarintLen64
	for name, vals := range h {
		size += len(name) + 2*binary.MaxVarintLen64
		for _, v := range vals {
			size += len(v) + binary.MaxVarintLen64
		}
	}
	return size
}

// appendHeader writes the count, then each name in sorted order with its values.
func appendHeader(b []byte, h map[string][]string) []byte {
	var stack [32]string
	names := stack[:0]
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendBytes(b, name)
		vals := h[name]
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = appendBytes(b, v)
		}
	}
	return b
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// DecodeRecord parses the output of Encode. It never panics and rejects any
// input that Encode could not have produced (wrong magic or version, unknown
// flags, a status outside 100-999, lengths past the end, trailing bytes).
func DecodeRecord(b []byte) (*Record, error) {
	d := decoder{b: b}
	if len(b) < 3 || b[0] != recordMagic || b[1] != recordVersion || b[2]&^(flagNoBody|flagTrailers) != 0 {
		return nil, fmt.Errorf("%w: bad header", errBadRecord)
	}
	r := &Record{BodyNotStored: b[2]&flagNoBody != 0}
	d.b = b[3:]
	status := d.uvarint()
	if status < 100 || status > 999 {
		return nil, fmt.Errorf("%w: status %d", errBadRecord, status)
	}
	r.Status = int(status)
	var err error
	if r.Header, err = d.header(); err != nil {
		return nil, err
	}
	body := d.bytes()
	if b[2]&flagTrailers != 0 {
		if r.Trailer, err = d.header(); err != nil {
			return nil, err
		}
		if d.err == nil && len(r.Trailer) == 0 {
			return nil, fmt.Errorf("%w: trailer flag without trailers", errBadRecord)
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errBadRecord, len(d.b))
	}
	if len(body) > 0 {
		r.Body = body
	}
	return r, nil
}

// header reads what appendHeader wrote; nil when the count is zero.
func (d *decoder) header() (map[string][]string, error) {
	n := d.count()
	var h map[string][]string
	if n > 0 {
		h = make(map[string][]string, n)
	}
	prev := "" // names are written sorted; anything else is not our encoding
	for range n {
		name := d.str()
		if d.err != nil {
			break
		}
		if name == "" {
			return nil, fmt.Errorf("%w: empty header name", errBadRecord)
		}
		if name <= prev {
			return nil, fmt.Errorf("%w: header %q out of order or repeated", errBadRecord, name)
		}
		prev = name
		nv := d.count()
		vals := make([]string, 0, nv)
		for range nv {
			vals = append(vals, d.str())
		}
		h[name] = vals
	}
	return h, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n != uvarintLen(v) { // minimal encodings only

		d.err = fmt.Errorf("%w: bad varint", errBadRecord)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads an element count; each element takes at least one byte, so a
// count above the remaining length is malformed (and must not size an
// allocation).
func (d *decoder) count() int {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: count %d past end", errBadRecord, n)
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: length %d past end", errBadRecord, n)
	}
	if d.err != nil {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func (d *decoder) str() string { return string(d.bytes()) }
