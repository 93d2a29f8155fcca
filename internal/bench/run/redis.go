package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// redisDo sends one command to the Redis server at addr and returns its reply
// as text: a simple string, an integer, or a bulk string. Enough for PING,
// FLUSHALL, DBSIZE and INFO; the benchmark uses no Redis client library.
func redisDo(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("redis %s: empty reply", args[0])
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis %s: %s", args[0], line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("redis %s: bad bulk length %q", args[0], line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("redis %s: unexpected reply %q", args[0], line)
}

// redisInfoField returns one "name:value" field of an INFO reply.
func redisInfoField(info, name string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), name+":"); ok {
			return v
		}
	}
	return ""
}

// redisCounters are the INFO counters the bench compares across a window.
type redisCounters struct {
	calls  map[string]int64 // INFO commandstats calls per command, commands run inside scripts included
	memory int64            // used_memory: bytes the allocator gave Redis
	keys   int64            // keys in db0 (INFO keyspace; 0 when empty)
}

// readRedisCounters reads them with one INFO, so that a snapshot adds one
// command to the next one's figures, not one per section.
func readRedisCounters(addr string) (redisCounters, error) {
	info, err := redisDo(addr, "INFO", "all")
	if err != nil {
		return redisCounters{calls: map[string]int64{}}, err
	}
	return parseRedisCounters(info)
}

func parseRedisCounters(info string) (redisCounters, error) {
	c := redisCounters{calls: parseCommandStats(info)}
	var err error
	if c.memory, err = strconv.ParseInt(redisInfoField(info, "used_memory"), 10, 64); err != nil {
		return c, fmt.Errorf("redis INFO: no used_memory: %w", err)
	}
	// Absent while db0 is empty: 0 keys then, not an error.
	for _, kv := range strings.Split(redisInfoField(info, "db0"), ",") {
		if v, ok := strings.CutPrefix(kv, "keys="); ok {
			c.keys, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return c, nil
}

// parseCommandStats turns INFO commandstats into calls per command
// ("cmdstat_evalsha:calls=12,usec=..." -> evalsha: 12).
func parseCommandStats(info string) map[string]int64 {
	out := map[string]int64{}
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimRight(l, "\r"), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				out[name], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return out
}
