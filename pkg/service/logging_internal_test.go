package service

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

// countingHandler counts how often a logger was derived from it.
type countingHandler struct {
	slog.Handler
	derived *int
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	*h.derived++
	return countingHandler{h.Handler.WithAttrs(as), h.derived}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	*h.derived++
	return countingHandler{h.Handler.WithGroup(name), h.derived}
}

// A logger made per message (With its ids) that never logs above the level
// costs no formatting of its attributes: the JSON handler is derived only
// when a record is written, once per logger however often it writes.
func TestLoggerWithDerivesOnlyWhenARecordIsWritten(t *testing.T) {
	var buf bytes.Buffer
	n := 0
	base := slog.New(contextHandler{countingHandler{slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}), &n}})
	for i := range 100 {
		log := base.With("event_id", i, "event_type", "PaymentSucceeded").With("result", "credited")
		log.Info("payment event applied") // below the level
	}
	if n != 0 {
		t.Fatalf("100 loggers that never wrote derived the JSON handler %d times, want 0", n)
	}
	log := base.With("event_id", 7).WithGroup("g").With("k", "v")
	log.Warn("one")
	log.Warn("two")
	if n != 3 {
		t.Fatalf("a logger derived by With, WithGroup, With that wrote twice derived the handler %d times, want 3 (once per step)", n)
	}
	if got := strings.Count(buf.String(), `"event_id":7,"g":{"k":"v"`); got != 2 {
		t.Fatalf("want both records to carry the attributes and group, got:\n%s", buf.String())
	}
}

// The lazy derivation writes exactly what the JSON handler writes when
// derived at once, attributes and groups in their order, context ids added.
func TestLazyLoggerWritesWhatTheEagerOneWrites(t *testing.T) {
	var lazy, eager bytes.Buffer
	l := slog.New(contextHandler{slog.NewJSONHandler(&lazy, nil)})
	e := slog.New(slog.NewJSONHandler(&eager, nil))
	for _, lg := range []*slog.Logger{l, e} {
		a := lg.With("service", "rewards").With()
		b := a.WithGroup("msg").With("event_id", "e1", slog.Group("sub", "x", 1))
		a.Info("first", "n", 1)
		b.Info("second", "n", 2)
		b.WithGroup("").With("more", true).InfoContext(context.Background(), "third")
	}
	strip := func(s string) string { // drop the time field, which differs
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
			out = append(out, line[strings.Index(line, `"level"`):])
		}
		return strings.Join(out, "\n")
	}
	if strip(lazy.String()) != strip(eager.String()) {
		t.Fatalf("lazy:\n%s\neager:\n%s", lazy.String(), eager.String())
	}
}
