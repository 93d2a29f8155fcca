package claim_test

import (
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/scripts"
)

// review14hGeneralComplete is complete.lua without its string fast path:
// every record goes through dec/enc (the general path).
func review14hGeneralComplete(t *testing.T) string {
	t.Helper()
	src := scripts.Complete
	i := strings.Index(src, "  if type(e) == 'string' and string.sub(e, 1, 3) == 'R2\\1'")
	end := "      return {'ok'}\n    end\n  end\n"
	j := strings.Index(src[i:], end)
	if i < 0 || j < 0 {
		t.Fatal("complete.lua: fast path not found")
	}
	return src[:i] + src[i+j+len(end):]
}

// review14hEnc builds a string record in the layout README and the scripts
// describe, with optional damage to its length bytes.
func review14hEnc(f [8]string, rec string) string {
	var b strings.Builder
	b.WriteString("R2")
	for _, s := range f {
		b.WriteByte(byte(len(s)))
	}
	for _, s := range f {
		b.WriteString(s)
	}
	b.WriteString(rec)
	return b.String()
}

func review14hOutcome(rdb *redis.Client, key string, v any, err error) string {
	typ := rdb.Type(ctx, key).Val()
	s := fmt.Sprintf("reply=%v err=%v type=%s", v, err, typ)
	if err != nil {
		// The error text names the script's sha and line: keep the message.
		msg := err.Error()
		if i := strings.Index(msg, " script:"); i >= 0 {
			msg = msg[:i]
		}
		msg = strings.ReplaceAll(msg, key, "<key>")
		if i := strings.Index(msg, "user_script:"); i >= 0 {
			if j := strings.Index(msg[i:], ": "); j >= 0 {
				msg = msg[:i] + msg[i+j+2:]
			}
		}
		s = fmt.Sprintf("reply=%v err=%s type=%s", v, msg, typ)
	}
	if typ == "string" {
		raw := rdb.Get(ctx, key).Val()
		if f, ok := decodeStringRecord(raw); ok {
			if f["ct"] != "" {
				f["ct"] = "<ct>" // Redis's clock: differs between the two runs
			}
			s += fmt.Sprintf(" fields=%q", f)
		} else {
			s += fmt.Sprintf(" raw=%q", raw)
		}
		pttl := rdb.PTTL(ctx, key).Val()
		s += fmt.Sprintf(" ttl~%ds", int(pttl.Round(time.Second)/time.Second))
	}
	return s
}

// TestReview14hCompleteFastPathMatchesGeneral (passes: evidence, not a
// finding): complete.lua's string fast path against the same script without
// it, on 400 records made by hand: every state, tokens that match only in
// part (a prefix, one byte more, another), expired and absent lock
// deadlines, ct/tr present, length bytes one off, truncated strings,
// answers of 0, 1, 100, 65536 and 65537 bytes, state c and u, with and
// without a trace. The reply, and the record left (ct aside), are the same.
// A non-numeric lock deadline is left out: see
// TestReview14hCompleteFastPathWritesBeforeFailing.
func TestReview14hCompleteFastPathMatchesGeneral(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	fast := redis.NewScript(scripts.Complete)
	general := redis.NewScript(review14hGeneralComplete(t))
	now := time.Now().UnixMilli()
	tok := "TOK\x00R2\x01i\xff-0123456" // newToken's bytes are random: NUL, the magic, 'i'
	fpv := "\x00" + strings.Repeat("F", 30) + "\x00"
	trace := "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
	rng := rand.New(rand.NewSource(14))
	pick := func(xs ...string) string { return xs[rng.Intn(len(xs))] }
	var diffs []string
	eligible := 0 // inputs the fast path takes
	for i := range 400 {
		f := [8]string{
			pick("i", "i", "i", "c", "u", "", "x"),
			pick(tok, tok, tok, tok[:15], tok+"X", "other-token-0000", ""),
			pick(fpv, "", "G"),
			pick("", "0123456789abcdef"),
			pick(strconv.FormatInt(now-1000, 10), ""),
			pick(strconv.FormatInt(now+60000, 10), strconv.FormatInt(now+60000, 10), strconv.FormatInt(now-10, 10), ""),
			pick("", "", "", strconv.FormatInt(now, 10)),
			pick("", "", "", trace),
		}
		oldRec := pick("", "", "", "504", "old answer")
		if rng.Intn(2) == 0 {
			// Near the fast path's case: our own in-flight claim as
			// claim.lua writes it, with at most one thing changed.
			f = [8]string{"i", tok, fpv, pick("", "0123456789abcdef"), strconv.FormatInt(now-1000, 10),
				pick(strconv.FormatInt(now+60000, 10), strconv.FormatInt(now-10, 10)), "", ""}
			oldRec = ""
			switch rng.Intn(8) {
			case 0:
				f[0] = pick("c", "u", "I")
			case 1:
				f[1] = pick(tok[:15], tok+"X", tok[:15]+"X", tok[1:])
			case 2:
				f[5] = ""
			case 3:
				f[6] = strconv.FormatInt(now, 10)
			case 4:
				f[7] = trace
			case 5:
				oldRec = pick("504", "x")
			}
		}
		v := review14hEnc(f, oldRec)
		switch rng.Intn(8) {
		case 0: // a length byte one too large or small
			j := 3 + rng.Intn(8)
			b := []byte(v)
			b[j-1] += byte(1 - 2*rng.Intn(2))
			v = string(b)
		case 1: // truncated
			v = v[:rng.Intn(len(v)+1)]
		}
		if v == review14hEnc(f, oldRec) && f[0] == "i" && f[1] == tok && f[5] != "" && f[6] == "" && f[7] == "" && oldRec == "" {
			eligible++
		}
		rec := strings.Repeat("r", []int{0, 1, 100, 65536, 65537}[rng.Intn(5)])
		argv := []any{tok, rec, 3600000, fpv, pick("", "0123456789abcdef"), pick("c", "c", "u"), pick("", trace), "s"}
		var out [2]string
		for wi, sc := range []*redis.Script{fast, general} {
			key := fmt.Sprintf("fp:%d:%d", i, wi)
			if err := rdb.Set(ctx, key, v, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			got, err := sc.Run(ctx, rdb, []string{key}, argv...).Result()
			out[wi] = review14hOutcome(rdb, key, got, err)
		}
		if out[0] != out[1] {
			if len(v) > 200 {
				v = v[:200] + "..."
			}
			diffs = append(diffs, fmt.Sprintf("record %q, state %v trace %q:\n  fast    %s\n  general %s", v, argv[5], argv[6], out[0], out[1]))
		}
	}
	if eligible < 10 {
		t.Errorf("only %d inputs took the fast path", eligible)
	}
	t.Logf("%d of 400 inputs took the fast path", eligible)
	for _, d := range diffs {
		if len(d) > 1200 {
			d = d[:1200]
		}
		t.Error(d)
	}
}

// TestReview14hCompleteFastPathWritesBeforeFailing (nit): the fast path
// writes the completed record first and compares the lock deadline after.
// On an in-flight record of ours whose ld is not a number (made by hand, or
// corrupted), the general path fails before writing anything, as the hash
// form does; the fast path rewrites the record as completed and then fails
// with a Lua error: the caller is told the completion failed (and retries)
// while it was in fact recorded, and the two paths leave different records.
func TestReview14hCompleteFastPathWritesBeforeFailing(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	tok := "TOKEN-0123456789"
	fpv := strings.Repeat("F", 32)
	rec := review14hEnc([8]string{"i", tok, fpv, "", strconv.FormatInt(time.Now().UnixMilli(), 10), "soon", "", ""}, "")
	var out [2]string
	for wi, sc := range []*redis.Script{redis.NewScript(scripts.Complete), redis.NewScript(review14hGeneralComplete(t))} {
		key := fmt.Sprintf("ld:%d", wi)
		if err := rdb.Set(ctx, key, rec, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := sc.Run(ctx, rdb, []string{key}, tok, "answer", 3600000, fpv, "", "c", "", "s").Result()
		out[wi] = review14hOutcome(rdb, key, got, err)
	}
	if out[0] != out[1] {
		t.Errorf("in-flight record with ld %q:\n  fast path    %s\n  general path %s\nwant the same (an error, nothing written)", "soon", out[0], out[1])
	}
}
