package claim_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReview70ReadmeRedisVersionNamesEveryCommand: the "Redis version"
// bullet of docs/scaling.md lists the commands the scripts use ("The scripts
// otherwise use HSET ..., with RECORD_FORMAT=string also MGET, GET and
// SET … NX PX"), which is what an operator checks an old server, a managed
// Redis's command allow-list or a restricted ACL user against. d4f17d9 made
// the scripts call SETRANGE (and, before it, APPEND); the list names
// neither.
func TestReview70ReadmeRedisVersionNamesEveryCommand(t *testing.T) {
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
