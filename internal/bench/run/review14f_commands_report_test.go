package main

import (
	"regexp"
	"strings"
	"testing"
)

// review14f: the report's pipeline depth ("N scripts per read", "the
// pipeline depth Redis saw") counts only EVALSHA and EVAL, so for the
// commands design (-ceiling commands), whose two SETs per request Redis got
// about 9 to a read (ceilcmd1.log: set 2.00, reads 0.22), it prints "0.0
// scripts per read": a depth of zero for a design that was pipelined. The
// README had to work out "7 to 12 commands per read" by hand.
func TestReview14fCommandsDesignPipelineDepth(t *testing.T) {
	cfg, code := parseFlags([]string{"-ceiling", "commands", "-only", "unique", "-rounds", "3"})
	if code >= 0 {
		t.Fatalf("exit code %d", code)
	}
	b := &bench{cfg: cfg}
	smp := func(rps float64, reads float64, cmds map[string]float64) sample {
		return sample{rps: rps, cpuUs: 100, p50ms: 1, p99ms: 2, rssMiB: 20, redisReads: reads, redisCmds: cmds}
	}
	idem := map[string]float64{"evalsha": 2, "hmget": 2, "hset": 2, "pexpire": 2, "time": 2, "get": 1}
	set := map[string]float64{"set": 2}
	res := []result{{workload: "unique", delay: 0,
		bare: []sample{smp(1000, 0, nil), smp(1000, 0, nil), smp(1000, 0, nil)},
		idem: []sample{smp(600, 0.14, idem), smp(600, 0.14, idem), smp(600, 0.14, idem)},
		ceil: []sample{smp(700, 0.22, set), smp(700, 0.22, set), smp(700, 0.22, set)},
	}}
	var sb strings.Builder
	b.report(&sb, res, nil, cpuTimes{}, "")
	got := sb.String()
	line := regexp.MustCompile(`(?m)^.*ceiling\(commands\): set 2\.00.*$`).FindString(got)
	if line == "" {
		t.Fatalf("no commands line for the ceiling in:\n%s", got)
	}
	if strings.Contains(line, "(0.0 ") {
		t.Errorf("the commands design's pipeline depth is reported as zero: %q (2 SETs / 0.22 reads = 9.1 per read)", line)
	}
}

// review14f: the floor section's verdict line sums up every mode against
// issue 14's 15 µs target but the new one: the commands mode (the figure
// the README's floor argument rests on, 7.8 µs in floor2.log) is in the
// table and nowhere in the verdict.
func TestReview14fFloorVerdictHasCommandsMode(t *testing.T) {
	smp := floorSamples
	floors := []floorResult{
		{mode: floorModes[0], samples: smp(27.0)},
		{mode: floorModes[1], samples: smp(2.6)},
		{mode: floorModes[2], samples: smp(49.1)},
		{mode: floorModes[3], samples: smp(11.4)},
		{mode: floorModes[4], samples: smp(7.8)},
	}
	if floorModes[4].script != "commands" {
		t.Fatalf("floorModes[4] = %v, want auto+commands", floorModes[4])
	}
	verdict, _ := floorVerdict(t, floors)
	if !strings.Contains(verdict, "7.8 µs") {
		t.Errorf("the floor verdict leaves out the commands mode (7.8 µs):\n%s", verdict)
	}
}

// The onehash mode, the least hash design's scripts at the floor, is in
// the verdict with how far idemproxy's scripts are above it: the figure
// the README's "Where Redis's 8 µs go" compares prototypes by.
func TestFloorVerdictHasOnehashMode(t *testing.T) {
	if floorModes[6].script != "onehash" {
		t.Fatalf("floorModes[6] = %v, want auto+onehash", floorModes[6])
	}
	verdict, lines := floorVerdict(t, []floorResult{{mode: floorModes[0], samples: floorSamples(16.8)}, {mode: floorModes[6], samples: floorSamples(11.0)}})
	if !strings.Contains(verdict, "(onehash): 11.0 µs, under the target: yes, idemproxy's scripts 5.8 µs above it") {
		t.Errorf("the floor verdict does not compare idemproxy's scripts with onehash's:\n%s", verdict)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "auto+onehash") {
		t.Errorf("no auto+onehash row in the floor table:\n%s", strings.Join(lines, "\n"))
	}
}
