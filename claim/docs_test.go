package claim_test

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"path/filepath"
	"regexp"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/scripts"
)

// TestDocsCommandsOfLargeAnswers (nit): docs/operations.md "Record format":
// with RECORD_FORMAT=string "A first request runs 5: TIME and SET … NX PX to
// claim; GET, TIME, SET … PX to complete".
// An answer over 64 KiB (MAX_STORED_RESPONSE_BYTES allows 64 MiB) is
// completed otherwise (first APPEND; since TestLargeRecordTakesItsSize
// TYPE, two SETRANGE, BITOP and PEXPIRE): commands the section has to name.
func TestDocsCommandsOfLargeAnswers(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	s := claim.NewStore(rdb, "cmds14h:", nil, claim.StringRecords(true))
	k := claim.NewKey(nil, "large first request")
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	lease, _, err := s.Acquire(ctx, k, fp("A"), claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	if err != nil || lease == nil {
		t.Fatalf("claim: %v, %v", lease, err)
	}
	if err := lease.Complete(ctx, &claim.Record{Status: 200, Body: make([]byte, 100<<10)}, time.Hour); err != nil {
		t.Fatal(err)
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	// The README's 5, less the completion's SET, and the commands it names
	// instead for an answer over 64 KiB.
	want := map[string]int64{"time": 2, "set": 1, "get": 1, "type": 1, "setrange": 2, "bitop": 1, "pexpire": 1}
	if got := commandStats(t, info); !reflect.DeepEqual(got, want) {
		t.Errorf("a first request with a 100 KiB answer runs %v; want %v", got, want)
	}
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(b)[strings.Index(string(b), "## Record format"):]
	sec = sec[:strings.Index(sec[4:], "\n#")+4]
	if !strings.Contains(sec, "`SETRANGE`") {
		t.Errorf("docs/operations.md \"Record format\" does not name the SETRANGE of a large answer")
	}
}

// TestClaimScriptDocumentsReplayOffset (nit): claim.lua's header
// lists its replies; a replay of a string record is {"replay", <the whole
// record string>, <pttl>, <tr, or empty>, <1-based offset of the answer>} since
// c44b53c, and claim.go's decodeReply comment still says "one to four
// strings". The header documents only the three- and four-element replays,
// whose second element is the answer itself: a reader of the script (or
// another client of it) would take the record header for the answer.
func TestClaimScriptDocumentsReplayOffset(t *testing.T) {
	head, _, _ := strings.Cut(scripts.Claim, "-- record codec")
	var replays []string
	for _, line := range strings.Split(head, "\n") {
		if strings.Contains(line, `{"replay"`) {
			replays = append(replays, strings.TrimSpace(strings.TrimPrefix(line, "--")))
		}
	}
	five := false
	for _, r := range replays {
		if strings.Count(r, ",") >= 4 {
			five = true
		}
	}
	if !five {
		t.Errorf("claim.lua's reply list documents the replays %q; none is the five-element string-record replay (whole string and offset) the script returns", replays)
	}
}

// TestDocsRedisVersionNamesEveryCommand: the "Redis version"
// bullet of docs/scaling.md lists the commands the scripts use ("The scripts
// otherwise use HSET ..., with RECORD_FORMAT=string also MGET, GET and
// SET … NX PX"), which is what an operator checks an old server, a managed
// Redis's command allow-list or a restricted ACL user against. d4f17d9 made
// the scripts call SETRANGE (and, before it, APPEND); the list names
// neither.
func TestDocsRedisVersionNamesEveryCommand(t *testing.T) {
	b, err := os.ReadFile("../docs/scaling.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "- **Redis version.**")
	if i < 0 {
		t.Fatal("no Redis version bullet")
	}
	sec := readme[i:]
	sec = sec[:strings.Index(sec, "\n\n")]
	files, _ := filepath.Glob("../scripts/*.lua")
	re := regexp.MustCompile(`redis\.p?call\('([A-Z]+)'`)
	seen := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			if !seen[m[1]] {
				seen[m[1]] = true
				if !regexp.MustCompile("`" + m[1] + "[ `]").MatchString(sec) {
					t.Errorf("%s calls %s; docs/scaling.md \"Redis version\" does not name it", filepath.Base(f), m[1])
				}
			}
		}
	}
}
