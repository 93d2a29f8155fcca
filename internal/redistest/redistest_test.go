package redistest

import (
	"context"
	"net"
	"testing"
	"time"
)

// A port taken between FreePort and redis-server's bind makes the server
// exit; Start tries another port instead of waiting 10s and failing.
func TestStartRetriesWhenThePortIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().(*net.TCPAddr).Port
	var picks int
	pickPort = func(t testing.TB) int {
		picks++
		if picks == 1 {
			return busy
		}
		return FreePort(t)
	}
	defer func() { pickPort = FreePort }()

	start := time.Now()
	s := Start(t)
	if s.Port() == busy || picks != 2 {
		t.Fatalf("server on port %d after %d picks; want the second pick, not the taken %d", s.Port(), picks, busy)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("Start took %v: it waited for the first server instead of seeing it exit", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Client().Ping(ctx).Err(); err != nil {
		t.Errorf("PING the restarted server: %v", err)
	}
}
