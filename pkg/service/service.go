// Package service is the plumbing every service of this project shares:
// configuration from the environment, JSON logs, OpenTelemetry metrics and
// trace propagation, a PostgreSQL pool that waits for the database at
// start, the health/readiness/metrics endpoints, and a runner that stops
// everything gracefully on SIGTERM. A new service built from the template
// keeps this package and writes only its own handlers.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/cenkalti/backoff/v5"
	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric/noop"
	"golang.org/x/sync/errgroup"
)

// LoadConfig fills a struct tagged for github.com/caarlos0/env (`env:"NAME"`,
// `envDefault:"..."`, `env:",required"`) from the environment. The error
// names every missing or malformed variable at once, so a misconfigured
// deployment fails at start with one readable message.
func LoadConfig[T any]() (T, error) {
	var cfg T
	if err := env.Parse(&cfg); err != nil {
		return cfg, fmt.Errorf("configuration: %w", nameVariables(reflect.TypeOf(cfg), err))
	}
	return cfg, nil
}

// nameVariables rewrites env's parse errors, which name the Go field
// ("LockTimeout"), to name the environment variable an operator sets
// ("IDEMPOTENCY_LOCK_TIMEOUT"). Other errors already name the variable.
func nameVariables(t reflect.Type, err error) error {
	var agg env.AggregateError
	if t.Kind() != reflect.Struct || !errors.As(err, &agg) {
		return err
	}
	vars := map[string][]string{}
	variableNames(t, "", vars)
	errs := make([]error, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			if name := variableOf(vars[pe.Name], pe.Err); name != "" {
				e = fmt.Errorf("%s: invalid value: %w", name, pe.Err)
			}
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// variableOf picks, of the variables a Go field name may stand for (a
// consumer's and a relay's BatchSize), the one whose value err refused:
// the only one set, or the one whose value err quotes.
func variableOf(names []string, err error) string {
	var set []string
	for _, n := range names {
		if v, ok := os.LookupEnv(n); ok {
			if len(names) == 1 || strings.Contains(err.Error(), strconv.Quote(v)) {
				return n
			}
			set = append(set, n)
		}
	}
	if len(set) == 1 {
		return set[0]
	}
	return strings.Join(names, " or ")
}

// variableNames maps the Go field names of t, and of the structs it nests
// with an envPrefix (embedded ones included), to their variable names:
// more than one where nested structs repeat a field name.
func variableNames(t reflect.Type, prefix string, vars map[string][]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		if p, ok := f.Tag.Lookup("envPrefix"); ok && f.Type.Kind() == reflect.Struct {
			variableNames(f.Type, prefix+p, vars)
			continue
		}
		if name, _, _ := strings.Cut(f.Tag.Get("env"), ","); name != "" && name != "-" {
			vars[f.Name] = append(vars[f.Name], prefix+name)
		}
	}
}

// Fatal logs err and exits with status 1: for errors at start-up only.
func Fatal(log *slog.Logger, msg string, err error) {
	log.Error(msg, "error", err)
	os.Exit(1)
}

// OpenPool connects to PostgreSQL, retrying for up to wait while the server
// is still coming up (as it is when a whole stack starts at once).
// maxConns, if above 0, is the pool's size unless url sets pool_max_conns.
func OpenPool(ctx context.Context, url string, maxConns int32, wait time.Duration, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	if maxConns > 0 && !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = maxConns
	}
	// Queries inside a trace become spans of it; acquiring a connection does
	// not (one span per query is enough to see where time went). otelpgx's
	// own per-query histograms are off: they cost ~10% of the pipeline's
	// throughput (measured with cmd/bench) and the spans carry the timings.
	cfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTrimSQLInSpanName(), otelpgx.WithDisableAcquireTracer(),
		otelpgx.WithMeterProvider(noop.NewMeterProvider()))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	_, err = backoff.Retry(ctx, func() (struct{}, error) {
		err := pool.Ping(ctx)
		if err != nil {
			log.Info("waiting for the database", "host", cfg.ConnConfig.Host, "database", cfg.ConnConfig.Database, "error", err)
		}
		return struct{}{}, err
	}, backoff.WithMaxElapsedTime(wait))
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("database %s on %s unreachable after %v: %w", cfg.ConnConfig.Database, cfg.ConnConfig.Host, wait, err)
	}
	return pool, nil
}

// Task is a long-running part of a service (HTTP server, relay, consumer).
// It runs until ctx is cancelled and then returns nil (or an error wrapping
// context.Canceled) after finishing its in-flight work. Any other return
// stops the whole service with an error: a task error, and also a return
// of nil or of context.Canceled while ctx is still live, since the service
// would otherwise stay up, and ready, without that task's work.
type Task struct {
	Name string
	Run  func(ctx context.Context) error
}

// DefaultShutdownTimeout bounds how long Run waits for tasks to drain after
// the stop signal when the caller gives no deadline. It outlasts the
// subscriber's last long poll (20 s) and the HTTP server's drain (10 s),
// and it bounds the subscriber's and the inbox processor's own grace for
// their handlers (30 s each, from when they stop taking work): a handler
// still running when it ends stops with the process, and its message or
// row, uncommitted, is redelivered or reclaimed as after a crash.
const DefaultShutdownTimeout = 30 * time.Second

// Process is the configuration every service's process shares: how long
// it drains at shutdown and how long its HTTP server waits for a slow
// client. Embed it in the service's config struct,
//
//	service.Process `envPrefix:""`
//
// so main loads DB_MAX_CONNS, SHUTDOWN_TIMEOUT, HTTP_READ_TIMEOUT,
// HTTP_WRITE_TIMEOUT, PPROF_ADDR and LOG_LEVEL with the rest; no function
// of this package but NewLogger reads the environment.
type Process struct {
	// DBMaxConns caps the service's PostgreSQL pool when its URL sets no
	// pool_max_conns. pgx's own default (the CPU count, at least 4) is too
	// small for a service whose relay workers each hold a connection while
	// their batch is on the wire and whose consumer runs several batches
	// at once; connections are opened only as they are needed.
	DBMaxConns       int32         `env:"DB_MAX_CONNS" envDefault:"10"`
	ShutdownTimeout  time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s"`
	HTTPReadTimeout  time.Duration `env:"HTTP_READ_TIMEOUT" envDefault:"15s"`
	HTTPWriteTimeout time.Duration `env:"HTTP_WRITE_TIMEOUT" envDefault:"60s"`
	// PprofAddr, when set, serves Go's runtime profiles on this loopback
	// address (see PprofTask); unset, there are none.
	PprofAddr string `env:"PPROF_ADDR"`
	// LogLevel is what NewLogger reads (it runs before the configuration
	// is loaded, to report it); here only so that Validate checks it.
	LogLevel string `env:"LOG_LEVEL"`
}

// ProcessConfig returns p; a config struct that embeds Process has it, which
// is what Main asks of its config.
func (p Process) ProcessConfig() Process { return p }

// Validate refuses settings the process cannot run with as written: a pool
// of no connections, a zero or negative deadline (which the HTTP server
// would take as none at all, leaving it open to slow clients), a log level
// NewLogger would replace by info, and profiles on an address that is not
// loopback.
// Load calls it for every service.
func (p Process) Validate() error {
	var l Limits
	l.AtLeast("DB_MAX_CONNS", int(p.DBMaxConns), 1)
	l.Positive("SHUTDOWN_TIMEOUT", p.ShutdownTimeout)
	l.Positive("HTTP_READ_TIMEOUT", p.HTTPReadTimeout)
	l.Positive("HTTP_WRITE_TIMEOUT", p.HTTPWriteTimeout)
	var level slog.Level
	if p.LogLevel != "" && level.UnmarshalText([]byte(p.LogLevel)) != nil {
		l.Add(fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", p.LogLevel))
	}
	if p.PprofAddr != "" && !Loopback(p.PprofAddr) {
		l.Add(fmt.Errorf("PPROF_ADDR=%q: profiles expose the process's memory; want a loopback address such as 127.0.0.1:6060", p.PprofAddr))
	}
	return l.Err()
}

// Tasks are the ones every process runs beside its own, from p: Go's
// profiles on PprofAddr when it is set.
func (p Process) Tasks(log *slog.Logger) ([]Task, error) {
	if p.PprofAddr == "" {
		return nil, nil
	}
	t, err := PprofTask(p.PprofAddr, log)
	if err != nil {
		return nil, err
	}
	return []Task{t}, nil
}

// HTTP is the server timeouts of p, for HTTPTask and NewHTTPServer.
func (p Process) HTTP() HTTPTimeouts {
	return HTTPTimeouts{Read: p.HTTPReadTimeout, Write: p.HTTPWriteTimeout}
}

// ErrShutdownDeadline is Run's error when tasks were still running at the
// shutdown deadline (its message names them).
var ErrShutdownDeadline = errors.New("shutdown deadline exceeded")

// ErrShutdownCutShort is Run's error when a second SIGINT or SIGTERM ended
// the drain before its deadline (its message names the tasks still running).
var ErrShutdownCutShort = errors.New("shutdown cut short by a second signal")

// Run runs tasks until SIGINT/SIGTERM, until ctx ends or until a task fails
// or returns before shutdown (see Task), then cancels the rest and waits
// for them to drain, for at most shutdown (zero or less:
// DefaultShutdownTimeout). A second SIGINT or SIGTERM (the first began the
// drain, or came during a drain begun otherwise) ends the wait at once. It
// returns the first task error, or an error naming the tasks still running
// at the deadline (ErrShutdownDeadline) or at the second signal
// (ErrShutdownCutShort): the caller then exits and the process's end stops
// them; everything they had not committed is redelivered or reclaimed, as
// after a crash.
func Run(ctx context.Context, log *slog.Logger, shutdown time.Duration, tasks ...Task) error {
	deadline := shutdown
	if deadline <= 0 {
		deadline = DefaultShutdownTimeout
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	running := map[string]bool{}
	for _, t := range tasks {
		mu.Lock()
		running[t.Name] = true
		mu.Unlock()
		g.Go(func() error {
			defer func() { mu.Lock(); delete(running, t.Name); mu.Unlock() }()
			log.Info("started", "task", t.Name)
			err := t.Run(gctx)
			switch {
			case err != nil && !errors.Is(err, context.Canceled):
				log.Error("task failed: stopping the service", "task", t.Name, "error", err)
				return fmt.Errorf("%s: %w", t.Name, err)
			case gctx.Err() == nil:
				// nil or context.Canceled are clean only once shutdown began.
				if err == nil {
					err = fmt.Errorf("%s: returned before shutdown, without an error", t.Name)
				} else {
					err = fmt.Errorf("%s: returned before shutdown: %w", t.Name, err)
				}
				log.Error("task returned before shutdown: stopping the service", "task", t.Name, "error", err)
				return err
			}
			log.Info("stopped", "task", t.Name)
			return nil
		})
	}
	stillRunning := func() string {
		mu.Lock()
		defer mu.Unlock()
		names := make([]string, 0, len(running))
		for n := range running {
			names = append(names, n)
		}
		slices.Sort(names)
		return strings.Join(names, ", ")
	}
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	signalled := false
	select {
	case err := <-done:
		return err
	case <-gctx.Done():
	case s := <-sigs:
		log.Info("signal received", "signal", s.String())
		signalled = true
		cancel()
	}
	log.Info("shutting down: draining in-flight work", "deadline", deadline.String())
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-timer.C:
			return fmt.Errorf("%w: %v; still running: %s", ErrShutdownDeadline, deadline, stillRunning())
		case s := <-sigs:
			if !signalled {
				log.Info("signal received: the drain is already under way; a second one cuts it short", "signal", s.String())
				signalled = true
				continue
			}
			log.Warn("second signal: the drain is cut short", "signal", s.String())
			return fmt.Errorf("%w (%v); still running: %s", ErrShutdownCutShort, s, stillRunning())
		}
	}
}

// HTTPTimeouts bound the phases of an HTTP server's connections; a zero
// field takes its default.
type HTTPTimeouts struct {
	// Read covers headers and body [15s]; headers alone get at most 5 s of it.
	Read time.Duration
	// Write covers the handler and the response [60s: above the slowest
	// provider call].
	Write time.Duration
}

// HTTPTask serves h on addr with the timeouts of NewHTTPServer, and shuts
// the server down gracefully (in-flight requests get up to 10 s) when ctx
// is cancelled.
func HTTPTask(addr string, h http.Handler, log *slog.Logger, timeouts HTTPTimeouts) Task {
	return Task{Name: "http " + addr, Run: func(ctx context.Context) error {
		srv := NewHTTPServer(addr, h, timeouts)
		errc := make(chan error, 1)
		go func() { errc <- srv.ListenAndServe() }()
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("http shutdown", "error", err)
		}
		return nil
	}}
}

// NewHTTPServer is the http.Server of HTTPTask: bounded in every phase, so
// a slow or stalled client (slowloris: headers or a body dribbled a byte at
// a time) holds a connection for seconds, not forever. Reads and writes are
// bounded by t; idle keep-alive connections close after 60 s; headers are
// capped at 64 KiB.
func NewHTTPServer(addr string, h http.Handler, t HTTPTimeouts) *http.Server {
	read, write := t.Read, t.Write
	if read <= 0 {
		read = 15 * time.Second
	}
	if write <= 0 {
		write = 60 * time.Second
	}
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: min(read, 5*time.Second), ReadTimeout: read,
		WriteTimeout: write, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 64 << 10}
}

// DefaultListenHost is the interface a service binds when LISTEN_ADDR is
// unset: loopback only, so a service started by hand is unreachable from
// the network until someone decides otherwise (containers set
// LISTEN_ADDR=0.0.0.0).
const DefaultListenHost = "127.0.0.1"

// ListenAddr is the address to listen on from LISTEN_ADDR (host, an IP or
// a name; "" means DefaultListenHost) and PORT (a port number). A PORT of
// the form host:port is the whole address, as before LISTEN_ADDR existed;
// then LISTEN_ADDR must be unset.
func ListenAddr(host, port string) (string, error) {
	return ListenAddrOf("PORT", host, port)
}

// ListenAddrOf is ListenAddr for a process whose port variable is named
// portVar (SMS_PROVIDER_PORT), so that its errors name what to fix.
func ListenAddrOf(portVar, host, port string) (string, error) {
	if h, p, err := net.SplitHostPort(port); err == nil {
		if host != "" {
			return "", fmt.Errorf("%s %q names a host and LISTEN_ADDR %q another: set the host in LISTEN_ADDR only", portVar, port, host)
		}
		host, port = h, p
		if host == "" {
			host = "0.0.0.0" // ":8081": every interface, as written
		}
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("%s %q: want a port number", portVar, port)
	}
	if host == "" {
		host = DefaultListenHost
	}
	if strings.ContainsAny(host, " /") {
		return "", fmt.Errorf("LISTEN_ADDR %q: want a host such as 127.0.0.1 or 0.0.0.0", host)
	}
	return net.JoinHostPort(host, port), nil
}

// Loopback reports whether addr (host:port) only accepts connections from
// this machine: a loopback IP or "localhost".
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
