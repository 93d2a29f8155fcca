package claim_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// recordFields reads the record at key whole, in either form: a hash's
// fields, or a string record decoded here, independently of the scripts'
// codec ('R2', the lengths of st, tok, fp, up, at, ld, ct and tr in one byte
// each, those fields, then rec). Empty fields are left out, as the scripts read
// them. nil: no such key.
func recordFields(t *testing.T, rdb redis.Cmdable, key string) map[string]string {
	t.Helper()
	typ, err := rdb.Type(ctx, key).Result()
	if err != nil {
		t.Fatalf("TYPE %s: %v", key, err)
	}
	out := map[string]string{}
	switch typ {
	case "none":
		return nil
	case "hash":
		h, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatalf("HGETALL %s: %v", key, err)
		}
		for f, v := range h {
			if v != "" {
				out[f] = v
			}
		}
		return out
	case "string":
		v, err := rdb.Get(ctx, key).Result()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		f, ok := decodeStringRecord(v)
		if !ok {
			t.Fatalf("%s: %q is not a string record", key, v)
		}
		return f
	}
	t.Fatalf("%s is a Redis %s, not a record", key, typ)
	return nil
}

func decodeStringRecord(v string) (map[string]string, bool) {
	if len(v) < 10 || v[:2] != "R2" {
		return nil, false
	}
	out, p := map[string]string{}, 10
	for i, f := range []string{"st", "tok", "fp", "up", "at", "ld", "ct", "tr"} {
		n := int(v[2+i])
		if p+n > len(v) {
			return nil, false
		}
		if n > 0 {
			out[f] = v[p : p+n]
		}
		p += n
	}
	if p < len(v) {
		out["rec"] = v[p:]
	}
	return out, true
}
