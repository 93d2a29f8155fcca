package claim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/scripts"
)

// TestReview14gResendAcrossForms (passes: evidence, not a finding): go-redis
// resends a script whose reply was lost. For every state a key can be in
// (none, in flight, lock expired, completed, unknown),
// hold or not, each record form and each writer form: the claim run twice
// with one token, then completed with it, answers as with hashes only (the
// second run recognises its own token; a completion after it is ok or lost
// alike).
func TestReview14gResendAcrossForms(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	cs := redis.NewScript(scripts.Claim)
	comp := redis.NewScript(scripts.Complete)
	n := 0
	type result struct{ first, second, third string }
	res := map[string]map[string]result{}
	for _, state := range []string{"none", "live", "expired", "c", "u"} {
		for _, hold := range []string{"", "1"} {
			for _, recForm := range []string{"", "s"} {
				for _, wForm := range []string{"", "s"} {
					n++
					rk := fmt.Sprintf("rs:{%d}", n)
					fpv := string(make([]byte, 32))
					// set up with the claim script in recForm
					switch state {
					case "live", "expired", "c", "u":
						lock := 60000
						if state == "expired" {
							lock = 1
						}
						if _, err := cs.Run(ctx, rdb, []string{rk}, "orig", fpv, lock, 3600000, "", "", recForm).Result(); err != nil {
							t.Fatal(err)
						}
						if state == "c" || state == "u" {
							st := map[string]string{"c": "c", "u": "u"}[state]
							if _, err := comp.Run(ctx, rdb, []string{rk}, "orig", "REC", 3600000, fpv, "", st, "", recForm).Result(); err != nil {
								t.Fatal(err)
							}
						}
					}
					time.Sleep(5 * time.Millisecond)
					r1, e1 := cs.Run(ctx, rdb, []string{rk}, "me", fpv, 60000, 3600000, "", hold, wForm).Result()
					r2, e2 := cs.Run(ctx, rdb, []string{rk}, "me", fpv, 60000, 3600000, "", hold, wForm).Result()
					r3, e3 := comp.Run(ctx, rdb, []string{rk}, "me", "MINE", 3600000, fpv, "", "c", "", wForm).Result()
					age := func(v any) string {
						s := fmt.Sprint(v)
						if a, ok := v.([]any); ok && len(a) > 1 && (a[0] == "takeover" || a[0] == "replay") {
							s = fmt.Sprint(a[0])
						}
						return s
					}
					r := result{age(r1) + fmt.Sprint(e1), age(r2) + fmt.Sprint(e2), age(r3) + fmt.Sprint(e3)}
					key := state + "/hold=" + hold
					if res[key] == nil {
						res[key] = map[string]result{}
					}
					res[key]["rec"+recForm+"/w"+wForm] = r
				}
			}
		}
	}
	for k, m := range res {
		ref := m["rec/w"]
		for f, r := range m {
			if r != ref {
				t.Errorf("%s %s: %v vs hash-only %v", k, f, r, ref)
			}
		}
	}
}
