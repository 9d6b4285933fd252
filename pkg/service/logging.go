package service

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"

	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/otel/trace"
)

// NewLogger returns a JSON logger tagged with the service name, at the level
// named by LOG_LEVEL (debug, info, warn, error; default info), and makes it
// the slog default so libraries log the same way. Every record logged with a
// context (slog's *Context methods) carries that context's request_id and,
// inside a span, its trace_id and span_id: one grep finds everything a
// request or a message did, in every service its trace crossed.
func NewLogger(name string) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(os.Getenv("LOG_LEVEL"))); err != nil {
		level = slog.LevelInfo
	}
	log := slog.New(NewContextHandler(os.Stdout, level)).With("service", name)
	slog.SetDefault(log)
	return log
}

// NewContextHandler is the JSON handler of NewLogger, writing to w.
func NewContextHandler(w io.Writer, level slog.Leveler) slog.Handler {
	return contextHandler{slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})}
}

// contextHandler adds the request id and the trace context of a record's
// context to the record.
type contextHandler struct{ slog.Handler }

func (h contextHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if id := middleware.GetReqID(ctx); id != "" {
			r.AddAttrs(slog.String("request_id", id))
		}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h contextHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if len(as) == 0 {
		return h
	}
	return contextHandler{&derived{parent: h.Handler, attrs: as}}
}

func (h contextHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return contextHandler{&derived{parent: h.Handler, group: name}}
}

// derived is a handler's WithAttrs or WithGroup, made when it is first
// needed. The JSON handler formats a logger's attributes when the logger
// is made, and the consumers make one per message (its event_id,
// event_type) that, above debug level, seldom writes anything: derived
// defers that work to the first record written, and does it once. (So an
// attribute's value is read then: a slice or a LogValuer given to With
// shows its state at the first record, not at With.)
type derived struct {
	parent slog.Handler
	attrs  []slog.Attr // WithAttrs(attrs), or
	group  string      // WithGroup(group)

	once sync.Once
	h    slog.Handler
}

func (d *derived) resolve() slog.Handler {
	d.once.Do(func() {
		p := d.parent
		if pd, ok := p.(*derived); ok {
			p = pd.resolve()
		}
		if d.group != "" {
			d.h = p.WithGroup(d.group)
		} else {
			d.h = p.WithAttrs(d.attrs)
		}
	})
	return d.h
}

// Enabled asks the parent: attributes and groups do not change a level.
func (d *derived) Enabled(ctx context.Context, l slog.Level) bool { return d.parent.Enabled(ctx, l) }

func (d *derived) Handle(ctx context.Context, r slog.Record) error { return d.resolve().Handle(ctx, r) }

func (d *derived) WithAttrs(as []slog.Attr) slog.Handler {
	return &derived{parent: d, attrs: as}
}

func (d *derived) WithGroup(name string) slog.Handler {
	return &derived{parent: d, group: name}
}
