package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rs/zerolog"
)

// redisLogger writes what go-redis logs (redis.SetLogger) through the
// proxy's logger, so that its lines are JSON like every other (by default
// go-redis prints plain text to stderr). Its messages report trouble, such
// as a connection pool that cannot dial, so they are warnings.
type redisLogger struct{ logger zerolog.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.logger.Warn().Str("component", "go-redis").Msg(strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// isTerminal reports whether w is a terminal (a character device such as a
// tty), the only place where colour codes belong; files and pipes get none.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
