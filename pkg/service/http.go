package service

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
)

// Check is one readiness probe (a database ping, a queue lookup).
type Check func(ctx context.Context) error

// NewRouter returns a chi router with request ids (X-Request-Id: the
// client's if it is short and safe, see requestID, else one made here;
// echoed in the response and put on every log line of the request), a
// server span per request continuing the caller's W3C trace
// (named by route, e.g. "POST /v1/payments/{id}/refund"), panic recovery,
// access logs, and the endpoints every service exposes: /healthz (the
// process is up), /readyz (every check passes within 2 s; the body names
// each check with "ok" or "failing", the error goes to the log; one
// evaluation answers every probe for ReadinessTTL) and
// /metrics. These three need no key.
//
// A path no route has is 404 not_found, a route asked with a method it
// lacks 405 method_not_allowed with its Allow header, both in the JSON
// error shape (errs.Body) of every other answer. Both come before any key
// is asked for: routing decides them, and the route's own middleware (the
// key, the rate limits) runs only for a method it has. That tells a caller
// without a key nothing it could not learn anyway: the routes and their
// methods are documented, and a known path already answers 401 where an
// unknown one answers 404. Asking for the key first would instead answer a
// wrong method with 401, sending a client with a good key after the wrong
// problem.
func NewRouter(log *slog.Logger, metrics http.Handler, checks map[string]Check) chi.Router {
	r := chi.NewRouter()
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) {
		WriteError(w, http.StatusNotFound, "not_found", "", "no such route")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		var allowed []string
		for _, m := range routeMethods {
			// HEAD is served wherever GET is (middleware.GetHead).
			if r.Match(chi.NewRouteContext(), m, req.URL.Path) ||
				m == http.MethodHead && r.Match(chi.NewRouteContext(), http.MethodGet, req.URL.Path) {
				allowed = append(allowed, m)
			}
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		// The request's method is not repeated: it is the caller's, of any length.
		WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", "",
			"this route does not take that method; it takes "+strings.Join(allowed, ", "))
	})
	r.Use(middleware.GetHead, requestID, echoRequestID,
		otelhttp.NewMiddleware("http", otelhttp.WithFilter(func(r *http.Request) bool { return !probe(r.URL.Path) }),
			otelhttp.WithServerName(serverName())),
		nameSpanByRoute, accessLog(log), recoverPanics(log))
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Method(http.MethodGet, "/readyz", &readiness{checks: checks, log: log})
	if metrics != nil {
		r.Method(http.MethodGet, "/metrics", metrics)
	}
	return r
}

// recoverPanics answers a handler's panic as InternalError answers any
// internal error: 500 in the JSON error shape with the request's id, the
// panic and its stack in the log under that id, none of it in the body. It
// runs inside the access log, which then records the 500.
// http.ErrAbortHandler is let through: it asks the server to drop the
// connection without an answer (httpidem's simulated crash does).
func recoverPanics(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				v := recover()
				if v == nil {
					return
				}
				if v == http.ErrAbortHandler { //nolint:errorlint // net/http compares it so
					panic(v)
				}
				InternalError(w, r, log, "handler panicked", fmt.Errorf("panic: %v\n%s", v, debug.Stack()))
			}()
			next.ServeHTTP(w, r)
		})
	}
}

// serverName is the server.address of the HTTP spans and metrics: this
// host's name, never the request's Host header, which the caller chooses
// (every made-up Host would otherwise be a new series of every HTTP metric).
// The port 0 keeps otelhttp from taking server.port from the Host header
// too; the listening port is in the process's configuration.
func serverName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "localhost"
	}
	return h + ":0"
}

// probe reports whether path is a health, readiness or metrics endpoint:
// polled every few seconds, neither traced nor logged.
func probe(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/metrics"
}

// routeMethods are the methods a 405's Allow header may list.
var routeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions}

// MaxRequestIDLength bounds a client's X-Request-Id that the router keeps.
const MaxRequestIDLength = 64

// requestID puts the request's id where middleware.GetReqID (the logs,
// InternalError) finds it: the client's X-Request-Id when it is 1 to
// MaxRequestIDLength of A-Z a-z 0-9 . _ : - (so a caller can follow its own
// id through the logs), otherwise a new random one of 26 such characters.
// Anything else a client sends (markup, spaces, control or bidi
// characters, kilobytes) is never echoed, logged or put in a 500 body.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(middleware.RequestIDHeader)
		if !safeRequestID(id) {
			id = rand.Text()
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), middleware.RequestIDKey, id)))
	})
}

func safeRequestID(id string) bool {
	if id == "" || len(id) > MaxRequestIDLength {
		return false
	}
	for i := range len(id) {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

func echoRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(middleware.RequestIDHeader, middleware.GetReqID(r.Context()))
		next.ServeHTTP(w, r)
	})
}

// nameSpanByRoute renames the request's span after routing, when chi knows
// the route pattern: bounded span names, unlike raw paths with ids in them.
func nameSpanByRoute(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			trace.SpanFromContext(r.Context()).SetName(r.Method + " " + rc.RoutePattern())
		}
	})
}

func accessLog(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
			next.ServeHTTP(ww, r)
			if probe(r.URL.Path) {
				return
			}
			log.InfoContext(r.Context(), "http request", "method", clip(r.Method, maxLoggedMethod), "path", clip(r.URL.Path, maxLoggedPath), "status", ww.Status(),
				"duration_ms", float64(time.Since(start).Microseconds())/1000)
		})
	}
}

// maxLoggedPath and maxLoggedMethod are how much of a request's path and
// method the access log keeps: both are the client's (a method is any
// token), and one line per request must stay a line.
const (
	maxLoggedPath   = 256
	maxLoggedMethod = 16
)

// clip is s, or its first n bytes and its length.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:n], len(s))
}

// ErrorBody is the JSON shape of every error response (errs.Body).
type ErrorBody = errs.Body

// ErrorDetail is the content of ErrorBody (errs.Detail).
type ErrorDetail = errs.Detail

// WriteJSON writes v as a JSON response with status.
func WriteJSON(w http.ResponseWriter, status int, v any) { errs.WriteJSON(w, status, v) }

// WriteError writes an ErrorBody (errs.Write).
func WriteError(w http.ResponseWriter, status int, code, field, message string) {
	errs.Write(w, status, code, field, message)
}

// InternalError answers 500 with code "internal" and the request's id, and
// logs err under that id. The body never carries err: its text (SQL,
// hosts, driver messages) is for the operator, not the caller.
func InternalError(w http.ResponseWriter, r *http.Request, log *slog.Logger, msg string, err error) {
	id := middleware.GetReqID(r.Context())
	log.ErrorContext(r.Context(), msg, "error", err) // the handler adds request_id
	WriteJSON(w, http.StatusInternalServerError, ErrorBody{Error: ErrorDetail{Code: "internal",
		Message: "internal error; quote the request id to the operator", RequestID: id}})
}

// IDParam is the path parameter name as the client meant it, unescaped
// (chi matches routes on the escaped path, so a client that writes '@' as
// %40 would otherwise be handed "%40"), or "" when it is not a valid id
// (events.ValidID): a handler answers "" with its 404 without a query.
func IDParam(r *http.Request, name string) string {
	id, err := url.PathUnescape(chi.URLParam(r, name))
	if err != nil || !events.ValidID(id) {
		return ""
	}
	return id
}
