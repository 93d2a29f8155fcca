package claim_test

import (
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/scripts"
)

// withoutFastPaths is src with the condition of each of its fast paths
// made false, so that every case takes the general path.
func withoutFastPaths(t *testing.T, src string, conds ...string) string {
	t.Helper()
	for _, c := range conds {
		if strings.Count(src, c) != 1 {
			t.Fatalf("fast-path condition %q: found %d times, want once", c, strings.Count(src, c))
		}
		src = strings.Replace(src, c, "if false then", 1)
	}
	return src
}

// TestFastPathsMatchGeneralPaths: the fast paths of claim.lua and
// complete.lua (a free key; our own in-flight claim) answer and write what
// their general paths would, in both forms, over records of every state and
// of both forms. claim.lua's fast paths are its writes (SET NX, HSETNX):
// without them the general path reads the key and writes the claim itself.
func TestFastPathsMatchGeneralPaths(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	fullClaim, fullComplete := redis.NewScript(scripts.Claim), redis.NewScript(scripts.Complete)
	const setNX = "refused = redis.pcall('SET', KEYS[1], 'R2'"
	if strings.Count(scripts.Claim, setNX) != 1 {
		t.Fatalf("claim.lua's string fast path %q: found %d times, want once", setNX, strings.Count(scripts.Claim, setNX))
	}
	slowClaim := redis.NewScript(withoutFastPaths(t, strings.Replace(scripts.Claim, setNX, "refused = false and redis.pcall('SET', KEYS[1], 'R2'", 1),
		"if #ARGV >= 5 and redis.pcall('HSETNX', KEYS[1], 'st', 'i') == 1 then"))
	slowComplete := redis.NewScript(withoutFastPaths(t, scripts.Complete,
		"if type(e) == 'string' and string.sub(e, 1, 3) == 'R2\\1' and string.sub(e, 11, 11) == 'i' then",
		"if not hh.err and hh[1] == 'i' and hh[2] == ARGV[1] and (ld or not hh[3]) then"))
	const tok = "TOK-0123456789ab"
	fpv := strings.Repeat("f", 32)
	now := time.Now().UnixMilli()
	past, future := fmt.Sprint(now-1000), fmt.Sprint(now+60000)
	// The records a key may hold before the script runs.
	type setup struct {
		name   string
		fields map[string]string // nil: no record
		str    bool              // as a string record (else a hash)
	}
	var setups []setup
	for _, st := range []string{"i", "c", "u"} {
		for _, tk := range []string{tok, "other-token-0000"} {
			for _, ld := range []string{past, future, "", "soon"} {
				for _, str := range []bool{false, true} {
					f := map[string]string{"st": st, "tok": tk, "fp": fpv, "at": fmt.Sprint(now - 2000), "ld": ld, "up": "0123456789abcdef"}
					if st != "i" {
						f["rec"], f["ct"] = "504", fmt.Sprint(now-500)
					}
					setups = append(setups, setup{fmt.Sprintf("%s/%.5s/ld=%q/string=%v", st, tk, ld, str), f, str})
				}
			}
		}
	}
	setups = append(setups, setup{"none", nil, false}, setup{"foreign hash", map[string]string{"x": "y"}, false})
	write := func(k string, s setup) {
		t.Helper()
		rdb.Del(ctx, k)
		if s.fields == nil {
			return
		}
		if !s.str {
			var args []any
			for f, v := range s.fields {
				args = append(args, f, v)
			}
			rdb.HSet(ctx, k, args...)
			rdb.PExpire(ctx, k, time.Hour)
			return
		}
		var head, body strings.Builder
		head.WriteString("R2")
		for _, f := range []string{"st", "tok", "fp", "up", "at", "ld", "ct", "tr"} {
			head.WriteByte(byte(len(s.fields[f])))
			body.WriteString(s.fields[f])
		}
		rdb.Set(ctx, k, head.String()+body.String()+s.fields["rec"], time.Hour)
	}
	// What a script left: its reply and the record, ct and at (Redis's
	// clock at the call) left out.
	outcome := func(k string, v any, err error) string {
		f := recordFields(t, rdb, k)
		delete(f, "ct")
		if f["st"] == "i" && f["tok"] == tok {
			delete(f, "at") // a new claim's times are the call's
			delete(f, "ld")
		}
		typ := rdb.Type(ctx, k).Val()
		ttl := rdb.PTTL(ctx, k).Val() > 0
		msg := ""
		if err != nil {
			msg = err.Error()
			if i := strings.Index(msg, "script:"); i >= 0 {
				msg = msg[:i] // the script's sha differs
			}
		}
		if r, ok := v.([]any); ok && len(r) > 1 && (r[0] == "takeover" || r[0] == "replay") {
			r = append([]any(nil), r...)
			r[map[any]int{"takeover": 1, "replay": 2}[r[0]]] = "MS" // an age or a PTTL: the call's
			v = r
		}
		return fmt.Sprintf("reply %q err %q record %s %v ttl %v", v, msg, typ, f, ttl)
	}
	for _, s := range setups {
		for _, form := range []string{"", "s"} {
			for _, hold := range []string{"", "1"} {
				k := "fast:{" + s.name + form + hold + "}"
				write(k, s)
				v, err := fullClaim.Run(ctx, rdb, []string{k}, tok, fpv, 30000, 3600000, "0123456789abcdef", hold, form).Result()
				fast := outcome(k, v, err)
				write(k, s)
				v, err = slowClaim.Run(ctx, rdb, []string{k}, tok, fpv, 30000, 3600000, "0123456789abcdef", hold, form).Result()
				if slow := outcome(k, v, err); fast != slow {
					t.Errorf("claim, %s, form %q, hold %q:\n fast    %s\n general %s", s.name, form, hold, fast, slow)
				}
			}
			for _, state := range []string{"c", "u"} {
				for _, rec := range []string{"encoded answer", strings.Repeat("x", 70000)} {
					k := "fastc:{" + s.name + form + state + fmt.Sprint(len(rec)) + "}"
					args := []any{tok, rec, 3600000, fpv, "0123456789abcdef", state, "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", form}
					write(k, s)
					v, err := fullComplete.Run(ctx, rdb, []string{k}, args...).Result()
					fast := outcome(k, v, err)
					write(k, s)
					v, err = slowComplete.Run(ctx, rdb, []string{k}, args...).Result()
					if slow := outcome(k, v, err); fast != slow {
						t.Errorf("complete %s, %s, form %q, rec %d bytes:\n fast    %s\n general %s", state, s.name, form, len(rec), fast, slow)
					}
				}
			}
		}
	}
}

// TestHashDuplicateCommands: the hash claim reads Redis's clock and writes
// first (TIME, HSETNX of st), as the string claim does, so a duplicate that
// reaches Redis runs those before the HMGET, and writes nothing: HSETNX on a
// record answers 0.
func TestHashDuplicateCommands(t *testing.T) {
	checkDuplicateCommands(t, "", func(rdb *redis.Client, key, st string, now int64) {
		f := []any{"st", st, "tok", otherToken, "fp", dupFP, "up", dupUpstream, "at", fmt.Sprint(now), "ld", fmt.Sprint(now + 60000)}
		if st == "c" {
			f = append(f, "rec", "ANSWER", "ct", fmt.Sprint(now))
		}
		if err := rdb.HSet(ctx, key, f...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.PExpire(ctx, key, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}, map[string]int64{"time": 1, "hsetnx": 1, "hmget": 1, "pttl": 1}, map[string]int64{"time": 1, "hsetnx": 1, "hmget": 1}, map[string]int64{"time": 1, "hsetnx": 1, "hmget": 1})
}

// TestHashClaimOverHashWithoutState: a hash at the key without st is not a
// record, and a claim overwrites it as if the key were free, as it did before
// the claim wrote first: HSETNX sets st, and the claim's other fields follow.
func TestHashClaimOverHashWithoutState(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	cur := redis.NewScript(scripts.Claim)
	key := "hwf:{foreign}"
	if err := rdb.HSet(ctx, key, "x", "y", "tok", "someone-elses-tk").Err(); err != nil {
		t.Fatal(err)
	}
	v, err := cur.Run(ctx, rdb, []string{key}, dupToken, dupFP, 30000, 600000, dupUpstream, "", "", "").Slice()
	if err != nil || len(v) != 1 || v[0] != "claimed" {
		t.Fatalf("claim over a hash without st: %v %v", v, err)
	}
	h := rdb.HGetAll(ctx, key).Val()
	if h["st"] != "i" || h["tok"] != dupToken || h["fp"] != dupFP || h["up"] != dupUpstream || h["at"] == "" || h["ld"] == "" {
		t.Errorf("the claim's record: %v", h)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 600*time.Second {
		t.Errorf("the claim's TTL %v, want the key TTL (10m)", ttl)
	}
}

// TestHashClaimErrorLeavesNothing: the hash claim writes st
// first, so whatever fails after it must not leave a state without the rest
// of its record: a lock nobody holds, without a TTL, which every later claim
// of the key would answer as another fingerprint's (422) for good. A bad
// lock TTL or a short argument list fail before HSETNX; an HSET the server
// refuses (an ACL without it) takes st back.
func TestHashClaimErrorLeavesNothing(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	if err := admin.Do(ctx, "ACL", "SETUSER", "nohset", "on", ">pw", "~*", "&*", "+@all", "-hset").Err(); err != nil {
		t.Fatal(err)
	}
	nohset := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nohset", Password: "pw"})
	t.Cleanup(func() { _ = nohset.Close() })
	cur := redis.NewScript(scripts.Claim)
	for _, tc := range []struct {
		name string
		rdb  *redis.Client
		args []any
	}{
		{"lock TTL not a number", admin, []any{dupToken, dupFP, "30s", 600000, dupUpstream, "", "", ""}},
		{"four arguments", admin, []any{dupToken, dupFP, 30000, 600000}},
		{"HSET refused (ACL)", nohset, []any{dupToken, dupFP, 30000, 600000, dupUpstream, "", "", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "hwf:{err " + tc.name + "}"
			if err := cur.Run(ctx, tc.rdb, []string{key}, tc.args...).Err(); err == nil {
				t.Fatal("the bad call succeeded")
			}
			if typ := admin.Type(ctx, key).Val(); typ != "none" {
				t.Errorf("the failed claim left a %s: %v, PTTL %v", typ, admin.HGetAll(ctx, key).Val(), admin.PTTL(ctx, key).Val())
			}
			v, err := cur.Run(ctx, admin, []string{key}, dupToken, dupFP, 30000, 600000, dupUpstream, "", "", "").Slice()
			if err != nil || len(v) != 1 || v[0] != "claimed" {
				t.Errorf("the next good claim: %v %v, want claimed", v, err)
			}
		})
	}
}

// generalCompleteScript is complete.lua without its string fast path:
// every record goes through dec/enc (the general path).
func generalCompleteScript(t *testing.T) string {
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

// encStringRecord builds a string record in the layout README and the scripts
// describe, with optional damage to its length bytes.
func encStringRecord(f [8]string, rec string) string {
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

func scriptOutcome(rdb *redis.Client, key string, v any, err error) string {
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

// TestCompleteFastPathMatchesGeneral (passes: evidence, not a
// finding): complete.lua's string fast path against the same script without
// it, on 400 records made by hand: every state, tokens that match only in
// part (a prefix, one byte more, another), expired and absent lock
// deadlines, ct/tr present, length bytes one off, truncated strings,
// answers of 0, 1, 100, 65536 and 65537 bytes, state c and u, with and
// without a trace. The reply, and the record left (ct aside), are the same.
// A non-numeric lock deadline is left out: see
// TestCompleteFastPathWritesBeforeFailing.
func TestCompleteFastPathMatchesGeneral(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	fast := redis.NewScript(scripts.Complete)
	general := redis.NewScript(generalCompleteScript(t))
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
		v := encStringRecord(f, oldRec)
		switch rng.Intn(8) {
		case 0: // a length byte one too large or small
			j := 3 + rng.Intn(8)
			b := []byte(v)
			b[j-1] += byte(1 - 2*rng.Intn(2))
			v = string(b)
		case 1: // truncated
			v = v[:rng.Intn(len(v)+1)]
		}
		if v == encStringRecord(f, oldRec) && f[0] == "i" && f[1] == tok && f[5] != "" && f[6] == "" && f[7] == "" && oldRec == "" {
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
			out[wi] = scriptOutcome(rdb, key, got, err)
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

// TestCompleteFastPathWritesBeforeFailing (nit): the fast path
// writes the completed record first and compares the lock deadline after.
// On an in-flight record of ours whose ld is not a number (made by hand, or
// corrupted), the general path fails before writing anything, as the hash
// form does; the fast path rewrites the record as completed and then fails
// with a Lua error: the caller is told the completion failed (and retries)
// while it was in fact recorded, and the two paths leave different records.
func TestCompleteFastPathWritesBeforeFailing(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	tok := "TOKEN-0123456789"
	fpv := strings.Repeat("F", 32)
	rec := encStringRecord([8]string{"i", tok, fpv, "", strconv.FormatInt(time.Now().UnixMilli(), 10), "soon", "", ""}, "")
	var out [2]string
	for wi, sc := range []*redis.Script{redis.NewScript(scripts.Complete), redis.NewScript(generalCompleteScript(t))} {
		key := fmt.Sprintf("ld:%d", wi)
		if err := rdb.Set(ctx, key, rec, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := sc.Run(ctx, rdb, []string{key}, tok, "answer", 3600000, fpv, "", "c", "", "s").Result()
		out[wi] = scriptOutcome(rdb, key, got, err)
	}
	if out[0] != out[1] {
		t.Errorf("in-flight record with ld %q:\n  fast path    %s\n  general path %s\nwant the same (an error, nothing written)", "soon", out[0], out[1])
	}
}

// infoMemory is the integer field of Redis's INFO memory: used_memory (what
// maxmemory bounds), or used_memory_lua (Redis's Lua heap; Redis 7 also
// calls it used_memory_vm_eval), which is not part of used_memory, so
// maxmemory does not bound it, and is in the RSS.
func infoMemory(t *testing.T, rdb *redis.Client, field string) int64 {
	t.Helper()
	for _, l := range strings.Split(rdb.Info(ctx, "memory").Val(), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in INFO memory", field)
	return 0
}

// TestStringFormLuaHeap: a string record is built and taken apart
// in Lua: complete.lua concatenates the whole answer into a new string
// (enc: table.concat) beside ARGV, claim.lua's replay copies it out of the
// value (dec: string.sub(v, p)). A hash record's answer goes through Lua
// once (ARGV, HMGET). So the Lua heap that Redis keeps after recording or
// replaying a large answer is about three times the answer with string
// records, once with hashes: with MAX_STORED_RESPONSE_BYTES at its 64 MiB
// bound, ~190 MB of Redis RSS outside maxmemory instead of ~64 MB. Redis
// sizing (and a container memory limit) has to know; the README's "Record
// format" says nothing of it.
func TestStringFormLuaHeap(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	heap := map[string][2]int64{}
	for _, f := range forms {
		srv := redistest.Start(t)
		rdb := srv.Client()
		s := claim.NewStore(rdb, "heap:", nil, claim.StringRecords(f.str))
		terms := claim.Terms{LockTTL: time.Minute, TTL: time.Hour}
		k := claim.NewKey(nil, "large answer")
		lease, _, err := s.Acquire(ctx, k, fp("A"), terms)
		if err != nil || lease == nil {
			t.Fatalf("%s: claim: %v, %v", f.name, lease, err)
		}
		if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: make([]byte, size)}, time.Hour); err != nil {
			t.Fatal(err)
		}
		afterComplete := infoMemory(t, rdb, "used_memory_lua")
		if _, rec, err := s.Acquire(ctx, k, fp("A"), terms); err != nil || rec == nil || len(rec.Body) != size {
			t.Fatalf("%s: replay: %v", f.name, err)
		}
		heap[f.name] = [2]int64{afterComplete, infoMemory(t, rdb, "used_memory_lua")}
	}
	t.Logf("Lua heap after recording / replaying an %d MiB answer: hash %v, string %v", size>>20, heap["hash"], heap["string"])
	for i, what := range []string{"recording", "replaying"} {
		if h, s := heap["hash"][i], heap["string"][i]; s > 2*h {
			t.Errorf("Lua heap after %s an %d MiB answer: %.1f MB with string records, %.1f MB with hashes (%.1fx)",
				what, size>>20, float64(s)/1e6, float64(h)/1e6, float64(s)/float64(h))
		}
	}
}

// TestHashFormLuaHeap: TestStringFormLuaHeap's budget (string records keep at
// most twice the Lua heap of hash records after recording a large answer)
// on setString's hash path: a string replica completing a claim that a
// hash replica held (mixed RECORD_FORMAT rollout, ON_UNKNOWN=hold, a slow
// upstream) writes SET head..rec, one more copy of the answer in Lua.
func TestHashFormLuaHeap(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	heap := map[string]int64{}
	for _, path := range []string{"hash", "string", "string-over-hash"} {
		srv := redistest.Start(t)
		rdb := srv.Client()
		s := claim.NewStore(rdb, "heap:", nil, claim.StringRecords(path != "hash"))
		terms := claim.Terms{LockTTL: 200 * time.Millisecond, TTL: time.Hour}
		k := claim.NewKey(nil, "large answer")
		lease, _, err := s.Acquire(ctx, k, fp("A"), terms)
		if err != nil || lease == nil {
			t.Fatalf("%s: claim: %v, %v", path, lease, err)
		}
		time.Sleep(300 * time.Millisecond)
		if path == "string-over-hash" {
			hs := claim.NewStore(rdb, "heap:", nil, claim.StringRecords(false))
			hold := terms
			hold.Hold = true
			if _, _, err := hs.Acquire(ctx, k, fp("A"), hold); err == nil {
				t.Fatal("hold: no error")
			}
		}
		if err := lease.Complete(ctx, &claim.Record{Status: 201, Body: make([]byte, size)}, time.Hour); err != nil {
			t.Fatal(err)
		}
		heap[path] = infoMemory(t, rdb, "used_memory_lua")
	}
	t.Logf("Lua heap after recording an %d MiB answer (late): %v", size>>20, heap)
	for _, p := range []string{"string", "string-over-hash"} {
		if heap[p] > 2*heap["hash"] {
			t.Errorf("Lua heap after recording an %d MiB answer on the %s path: %.1f MB, hash records %.1f MB (%.1fx)",
				size>>20, p, float64(heap[p])/1e6, float64(heap["hash"])/1e6, float64(heap[p])/float64(heap["hash"]))
		}
	}
}

// TestScriptsAreIdempotentPerToken: go-redis resends a script whose reply
// was lost; the resent claim or completion must see its own earlier write
// as success, not as someone else's claim.
func TestScriptsAreIdempotentPerToken(t *testing.T) {
	srv := redistest.Start(t)
	s := claim.NewStore(srv.Client(), "test:", nil)
	k := claim.NewKey(nil, "resend")
	fp := string(make([]byte, 32))
	for i := range 2 {
		status, err := s.RunScript(ctx, "claim", k, "token-1", fp, claim.MS(time.Minute), claim.MS(time.Hour), "", "")
		if err != nil || status != "claimed" {
			t.Fatalf("claim #%d with the same token: %q, %v; want claimed", i+1, status, err)
		}
	}
	if status, _ := s.RunScript(ctx, "claim", k, "token-2", fp, claim.MS(time.Minute), claim.MS(time.Hour), "", ""); status != "inflight" {
		t.Fatalf("claim with another token: %q, want inflight", status)
	}
	rec := (&claim.Record{Status: 201}).Encode()
	for i := range 2 {
		if status, err := s.RunScript(ctx, "complete", k, "token-1", rec, claim.MS(time.Hour), fp, "", "c"); err != nil || status != "ok" {
			t.Fatalf("complete #%d with the same token: %q, %v; want ok", i+1, status, err)
		}
	}
	if status, _ := s.RunScript(ctx, "complete", k, "token-2", rec, claim.MS(time.Hour), fp, "", "c"); status != "lost" {
		t.Fatalf("complete with another token: %q, want lost", status)
	}
}

// TestScriptCodecsAgree: the string record codec is copied into each script
// (a script runs on its own, with redis-cli too); the copies must not drift.
func TestScriptCodecsAgree(t *testing.T) {
	codec := func(name, src string) string {
		i := strings.Index(src, "-- record codec")
		j := strings.Index(src, "-- end of record codec")
		if i < 0 || j < i {
			t.Fatalf("%s: no record codec block", name)
		}
		return src[i:j]
	}
	want := codec("claim.lua", scripts.Claim)
	for name, src := range map[string]string{"complete.lua": scripts.Complete, "release.lua": scripts.Release, "inspect.lua": scripts.Inspect} {
		if got := codec(name, src); got != want {
			t.Errorf("%s's record codec differs from claim.lua's:\n%s\nwant\n%s", name, got, want)
		}
	}
}
