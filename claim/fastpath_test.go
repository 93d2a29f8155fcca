package claim_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
