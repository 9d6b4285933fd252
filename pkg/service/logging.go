package service

import (
	"context"
	"io"
	"log/slog"
	"os"

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
	return contextHandler{h.Handler.WithAttrs(as)}
}

func (h contextHandler) WithGroup(name string) slog.Handler {
	return contextHandler{h.Handler.WithGroup(name)}
}
