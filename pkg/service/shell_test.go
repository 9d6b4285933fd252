package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/service"
)

// records decodes JSON log lines.
func records(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestRouterGivesEveryRequestAnIDASpanNamedByRouteAndLogsBothOnEachLine(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })

	var buf bytes.Buffer
	log := slog.New(service.NewContextHandler(&buf, slog.LevelInfo))
	r := service.NewRouter(log, nil, nil)
	r.Get("/v1/things/{id}", func(w http.ResponseWriter, req *http.Request) {
		log.InfoContext(req.Context(), "handler ran")
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	const caller = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/things/42", nil)
	req.Header.Set("X-Request-Id", "req-abc")
	req.Header.Set("traceparent", "00-"+caller+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-Id"); got != "req-abc" {
		t.Errorf("X-Request-Id echoed %q, want req-abc", got)
	}
	// A request without an id gets one made up.
	resp, err = http.Get(srv.URL + "/v1/things/43")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id made for a request without one")
	}
	// Probes are neither traced nor logged.
	resp, err = http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	ended := spans.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans ended, want 2 (the probe is not traced)", len(ended))
	}
	if ended[0].Name() != "GET /v1/things/{id}" || ended[0].SpanContext().TraceID().String() != caller {
		t.Errorf("span %q in trace %s, want \"GET /v1/things/{id}\" continuing %s", ended[0].Name(), ended[0].SpanContext().TraceID(), caller)
	}
	recs := records(t, &buf)
	if len(recs) != 4 { // handler + access log, twice
		t.Fatalf("%d log records, want 4: %s", len(recs), buf.String())
	}
	for _, rec := range recs[:2] {
		if rec["request_id"] != "req-abc" || rec["trace_id"] != caller || rec["span_id"] == nil {
			t.Errorf("log record %v lacks request_id req-abc / trace_id %s / span_id", rec, caller)
		}
	}
}

func TestLogConfigMasksSecretsAndURLPasswords(t *testing.T) {
	type inner struct {
		Lease time.Duration `env:"LEASE"`
	}
	type config struct {
		DatabaseURL string            `env:"X_DATABASE_URL"`
		APIKeys     string            `env:"X_API_KEYS" secret:"true"`
		Unset       string            `env:"X_UNSET_SECRET" secret:"true"`
		Port        string            `env:"PORT"`
		Relay       inner             `envPrefix:"RELAY_"`
		Hook        func()            `env:"-"`
		Extra       map[string]string `env:"-"`
	}
	var buf bytes.Buffer
	service.LogConfig(slog.New(slog.NewJSONHandler(&buf, nil)), config{
		DatabaseURL: "postgres://app:hunter2@db:5432/payments?sslmode=disable",
		APIKeys:     "client1:sk_live_abcdef",
		Port:        "8081",
		Relay:       inner{Lease: 30 * time.Second},
	})
	out := buf.String()
	for _, leak := range []string{"hunter2", "sk_live_abcdef", "client1"} {
		if strings.Contains(out, leak) {
			t.Errorf("config summary leaks %q: %s", leak, out)
		}
	}
	rec := records(t, &buf)[0]
	for k, want := range map[string]string{
		"X_DATABASE_URL": "postgres://app:xxxxx@db:5432/payments?sslmode=disable",
		"X_API_KEYS":     "***", "X_UNSET_SECRET": "(unset)", "PORT": "8081", "RELAY_LEASE": "30s",
	} {
		if rec[k] != want {
			t.Errorf("%s = %v, want %q", k, rec[k], want)
		}
	}
	if _, ok := rec["Hook"]; ok {
		t.Error("env:\"-\" field logged")
	}
}

// Run stops waiting at the deadline it is given and names what still runs.
func TestRunStopsWaitingForATaskThatIgnoresCancellationAtTheShutdownDeadline(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	block := make(chan struct{})
	defer close(block)
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, slog.New(slog.DiscardHandler), 300*time.Millisecond,
			service.Task{Name: "polite", Run: func(ctx context.Context) error { <-ctx.Done(); return nil }},
			service.Task{Name: "stuck", Run: func(context.Context) error { <-block; return nil }})
	}()
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	cancel()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "still running: stuck") || strings.Contains(err.Error(), "polite") {
			t.Errorf("Run returned %v, want the deadline error naming only the stuck task", err)
		}
		if d := time.Since(t0); d < 300*time.Millisecond {
			t.Errorf("Run returned after %v, before the deadline", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run still waiting 5 s after cancel: the deadline did not hold")
	}
}

// A task that returns nil, or an error of its own wrapping context.Canceled,
// while the service is not shutting down has stopped doing its work (a
// relay or consumer loop that quit): Run must stop the whole service with
// an error naming it, not log "stopped" and keep the rest running and
// ready without it. The same returns once shutdown began are clean.
func TestATaskReturningBeforeShutdownStopsTheServiceWithAnError(t *testing.T) {
	for name, early := range map[string]error{
		"nil":                      nil,
		"its own context.Canceled": errors.Join(errors.New("consumer: receive"), context.Canceled),
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewJSONHandler(&buf, nil))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- service.Run(ctx, log, time.Second,
					service.Task{Name: "quits", Run: func(context.Context) error { return early }},
					service.Task{Name: "serves", Run: func(ctx context.Context) error { <-ctx.Done(); return nil }})
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(3 * time.Second):
				t.Fatal("task \"quits\" returned before shutdown, yet Run still runs the service 3 s later")
			}
			if err == nil || !strings.Contains(err.Error(), "quits: returned before shutdown") {
				t.Errorf("Run returned %v, want an error naming the task that returned before shutdown", err)
			}
			var failed, quitStopped, servesStopped bool
			for _, rec := range records(t, &buf) {
				switch {
				case rec["msg"] == "task returned before shutdown: stopping the service" && rec["task"] == "quits" && rec["level"] == "ERROR":
					failed = true
				case rec["msg"] == "stopped" && rec["task"] == "quits":
					quitStopped = true
				case rec["msg"] == "stopped" && rec["task"] == "serves":
					servesStopped = true
				}
			}
			if !failed || quitStopped {
				t.Errorf("want an ERROR record for the early return of \"quits\" and no \"stopped\" one; log:\n%s", buf.String())
			}
			if !servesStopped {
				t.Errorf("the other task was not stopped; log:\n%s", buf.String())
			}
		})
	}
	t.Run("the same returns after shutdown began are clean", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- service.Run(ctx, slog.New(slog.DiscardHandler), time.Second,
				service.Task{Name: "nil", Run: func(ctx context.Context) error { <-ctx.Done(); return nil }},
				service.Task{Name: "canceled", Run: func(ctx context.Context) error { <-ctx.Done(); return fmt.Errorf("receive: %w", ctx.Err()) }})
		}()
		time.Sleep(50 * time.Millisecond)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v after shutdown, want nil", err)
		}
	})
}

// An operator who presses Ctrl-C twice (or an orchestrator that signals
// again) wants the process gone now, not after SHUTDOWN_TIMEOUT: a second
// SIGINT during the drain the first one began ends Run's wait at once,
// with an error naming the tasks still running, as at the deadline.
func TestASecondSignalDuringTheDrainEndsTheWaitAtOnce(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	block, draining := make(chan struct{}), make(chan struct{})
	defer close(block)
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		done <- service.Run(context.Background(), log, 30*time.Second,
			service.Task{Name: "polite", Run: func(ctx context.Context) error { <-ctx.Done(); return nil }},
			service.Task{Name: "stuck", Run: func(ctx context.Context) error {
				close(started)
				<-ctx.Done()
				close(draining)
				<-block // ignores the drain
				return nil
			}})
	}()
	<-started
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-draining:
	case <-time.After(5 * time.Second):
		t.Fatal("the first SIGINT did not start the drain")
	}
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Run still waiting 3 s after the second SIGINT: it did nothing, the wait goes on to the 30 s deadline")
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("Run returned %v after the second SIGINT, want at once", d)
	}
	if !errors.Is(err, service.ErrShutdownCutShort) || !strings.Contains(err.Error(), "still running: stuck") || strings.Contains(err.Error(), "polite") {
		t.Errorf("Run returned %v, want ErrShutdownCutShort naming only the stuck task", err)
	}
	var cut bool
	for _, rec := range records(t, &buf) {
		if rec["msg"] == "second signal: the drain is cut short" && rec["level"] == "WARN" {
			cut = true
		}
	}
	if !cut {
		t.Errorf("no record of the cut-short drain; log:\n%s", buf.String())
	}
}

// The process settings are loaded with the service's config, by name, with
// their defaults; a malformed one is refused at start, named.
func TestProcessSettingsLoadWithTheServiceConfigAndAreRefusedByName(t *testing.T) {
	type config struct {
		service.Process `envPrefix:""`
		Port            string `env:"PORT" envDefault:"8081"`
	}
	t.Setenv("HTTP_READ_TIMEOUT", "500ms")
	cfg, err := service.LoadConfig[config]()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ShutdownTimeout != service.DefaultShutdownTimeout || cfg.HTTP() != (service.HTTPTimeouts{Read: 500 * time.Millisecond, Write: time.Minute}) {
		t.Errorf("process config %+v", cfg.Process)
	}
	if srv := service.NewHTTPServer(":0", nil, cfg.HTTP()); srv.ReadTimeout != 500*time.Millisecond || srv.ReadHeaderTimeout != 500*time.Millisecond || srv.WriteTimeout != time.Minute {
		t.Errorf("server timeouts read %v header %v write %v", srv.ReadTimeout, srv.ReadHeaderTimeout, srv.WriteTimeout)
	}
	t.Setenv("SHUTDOWN_TIMEOUT", "soon")
	if _, err := service.LoadConfig[config](); err == nil || !strings.Contains(err.Error(), "SHUTDOWN_TIMEOUT") {
		t.Errorf("SHUTDOWN_TIMEOUT=soon: LoadConfig returned %v", err)
	}
}

// A process setting the server or the pool cannot honour as written (a
// zero deadline is none at all to net/http) stops every service at Load,
// all of them named in one error, with the service's own checks beside.
func TestProcessSettingsOutOfRangeAreRefusedAtLoadAllAtOnce(t *testing.T) {
	t.Setenv("DB_MAX_CONNS", "0")
	t.Setenv("SHUTDOWN_TIMEOUT", "-1s")
	t.Setenv("HTTP_READ_TIMEOUT", "0s")
	t.Setenv("HTTP_WRITE_TIMEOUT", "1m")
	t.Setenv("LOG_LEVEL", "verbose")
	t.Setenv("PPROF_ADDR", "0.0.0.0:6060")
	_, err := service.Load[completing](nil)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"configuration: ", "DB_MAX_CONNS=0: want at least 1", "SHUTDOWN_TIMEOUT=-1s", "HTTP_READ_TIMEOUT=0s",
		`LOG_LEVEL="verbose": want debug, info, warn or error`, `PPROF_ADDR="0.0.0.0:6060"`, "the service's own"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "HTTP_WRITE_TIMEOUT") {
		t.Errorf("error %q names the valid HTTP_WRITE_TIMEOUT", err)
	}
	t.Setenv("DB_MAX_CONNS", "4")
	t.Setenv("SHUTDOWN_TIMEOUT", "5s")
	t.Setenv("HTTP_READ_TIMEOUT", "5s")
	t.Setenv("LOG_LEVEL", "DEBUG")
	t.Setenv("PPROF_ADDR", "127.0.0.1:6060")
	if _, err := service.Load[completing]([]string{"ok"}); err != nil {
		t.Errorf("valid settings refused: %v", err)
	}
}

// completing is a config whose Complete fails unless its argument is "ok".
type completing struct {
	service.Process `envPrefix:""`
}

func (c *completing) Complete(args []string) error {
	if len(args) == 1 && args[0] == "ok" {
		return nil
	}
	return errors.New("the service's own check failed")
}

func TestTraceExporterIsChosenByTheStandardVariablesAndIsNoneWhenUnset(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     map[string]string
		want    string
		wantErr string
	}{
		{"nothing set", nil, "none", ""},
		{"endpoint only", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "otlp", ""},
		{"traces endpoint only", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, "otlp", ""},
		{"explicit otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, "otlp", ""},
		{"console", map[string]string{"OTEL_TRACES_EXPORTER": "console"}, "console", ""},
		{"none wins over an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, "none", ""},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, "none", ""},
		{"grpc is not built in", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "", "http/protobuf only"},
		{"unknown exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, "", "want otlp, console or none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
				t.Setenv(k, c.env[k])
			}
			tel, err := service.SetupTelemetry("test")
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tel.Shutdown(context.Background())
			if tel.Exporter != c.want {
				t.Errorf("exporter %q, want %q", tel.Exporter, c.want)
			}
		})
	}
}

// An unknown route is 404 and a known route asked with another method 405
// (with its Allow header), both in the JSON error shape of every other
// answer, before any key is asked for.
func TestUnknownRoutesAndWrongMethodsAnswerTheJSONErrorShape(t *testing.T) {
	r := service.NewRouter(slog.New(slog.DiscardHandler), nil, nil)
	r.Group(func(r chi.Router) {
		r.Use(service.RequireAPIKey(service.APIKeys{}))
		r.Get("/v1/things/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
		r.Post("/v1/things/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	testenv.RoutingErrors(t, srv.URL, "", []testenv.RoutingCase{
		{Method: http.MethodGet, Path: "/nope", Status: http.StatusNotFound, Code: "not_found"},
		{Method: http.MethodGet, Path: "/v1/things", Status: http.StatusNotFound, Code: "not_found"},
		{Method: http.MethodDelete, Path: "/v1/things/1", Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Allow: "GET, HEAD, POST"},
		{Method: http.MethodPost, Path: "/healthz", Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Allow: "GET, HEAD"},
	})
}

// A client's X-Request-Id is kept only when it is short and safe (1 to 64
// of A-Z a-z 0-9 . _ : -); any other is replaced by a made one, which is
// what the response, the logs and a 500 body then carry.
func TestAClientsRequestIDIsKeptOnlyWhenShortAndSafe(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(service.NewContextHandler(&buf, slog.LevelInfo))
	r := service.NewRouter(log, nil, nil)
	r.Get("/fail", func(w http.ResponseWriter, req *http.Request) {
		service.InternalError(w, req, log, "it failed", errors.New("boom"))
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	safe := regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)
	long64 := strings.Repeat("a", 64)
	for _, c := range []struct {
		sent string
		kept bool
	}{
		{"req-abc", true},
		{"trace:01J.x_y-z", true},
		{long64, true},
		{long64 + "a", false},
		{"<script>alert(1)</script>", false},
		{"a b", false},
		{"id\u202e", false},
		{strings.Repeat("x", 3000), false},
	} {
		buf.Reset()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/fail", nil)
		req.Header.Set("X-Request-Id", c.sent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b service.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&b)
		resp.Body.Close()
		got := resp.Header.Get("X-Request-Id")
		what := fmt.Sprintf("X-Request-Id %.40q", c.sent)
		if c.kept && got != c.sent {
			t.Errorf("%s: echoed %q, want it kept", what, got)
		}
		if !c.kept && (got == c.sent || !safe.MatchString(got)) {
			t.Errorf("%s: echoed %q, want a new safe id", what, got)
		}
		if b.Error.RequestID != got {
			t.Errorf("%s: the 500 body says request_id %q, the header %q", what, b.Error.RequestID, got)
		}
		if !c.kept && strings.Contains(buf.String(), c.sent) {
			t.Errorf("%s: the logs carry the client's id:\n%s", what, buf.String())
		}
		if !strings.Contains(buf.String(), `"request_id":"`+got+`"`) {
			t.Errorf("%s: no log line with request_id %q:\n%s", what, got, buf.String())
		}
	}
}

// The access log names a request's path, but a client's path is not the
// log's to carry whole: one past 256 bytes is cut there, its length said,
// so a 3,000-byte path (or a flood of them) cannot swell the log line.
func TestTheAccessLogCutsALongPath(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(service.NewContextHandler(&buf, slog.LevelInfo))
	srv := httptest.NewServer(service.NewRouter(log, nil, nil))
	defer srv.Close()
	long := "/v1/" + strings.Repeat("x", 3000)
	for _, path := range []string{"/v1/short", long} {
		buf.Reset()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		var line struct {
			Msg, Path string
		}
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil || line.Msg != "http request" {
			t.Fatalf("%.20s: access log %q (%v)", path, buf.String(), err)
		}
		switch path {
		case long:
			if want := long[:256] + "…(3004 bytes)"; line.Path != want {
				t.Errorf("long path logged as %.300q, want the first 256 bytes and the length", line.Path)
			}
		default:
			if line.Path != path {
				t.Errorf("path logged as %q, want %q", line.Path, path)
			}
		}
	}
}

// A variable set a letter or two away from one the service reads is
// almost surely a misspelling that the service would otherwise ignore in
// silence, running on the default: LogConfig warns, naming the variable
// and the one it is near (never its value, which may be a secret).
// Variables that are far from every name (PATH, HOME), or its plural, are
// not warned of.
func TestLogConfigWarnsOfAVariableNearlyNamedLikeASetting(t *testing.T) {
	type inner struct {
		BatchSize int `env:"BATCH_SIZE"`
	}
	type config struct {
		Retention time.Duration `env:"X_DEDUPE_RETENTION"`
		Relay     inner         `envPrefix:"X_RELAY_"`
	}
	t.Setenv("X_RELAY_BATCH_SZE", "s3cret-ish")
	t.Setenv("X_DEDUP_RETENTION", "1h")
	t.Setenv("X_DEDUPE_RETENTION", "400h") // the right one: no warning
	t.Setenv("X_SOMETHING_ELSE", "1")
	t.Setenv("X_DEDUPE_RETENTIONS", "1h") // a plural: a client's KEY beside a server's KEYS
	var buf bytes.Buffer
	service.LogConfig(slog.New(slog.NewJSONHandler(&buf, nil)), config{})
	if strings.Contains(buf.String(), "s3cret-ish") {
		t.Errorf("the warning leaks the value: %s", buf.String())
	}
	warned := map[string]any{}
	for _, rec := range records(t, &buf) {
		if rec["level"] == "WARN" {
			warned[fmt.Sprint(rec["variable"])] = rec["did_you_mean"]
		}
	}
	want := map[string]any{"X_RELAY_BATCH_SZE": "X_RELAY_BATCH_SIZE", "X_DEDUP_RETENTION": "X_DEDUPE_RETENTION"}
	if fmt.Sprint(warned) != fmt.Sprint(want) {
		t.Errorf("warned of %v, want %v", warned, want)
	}
}
