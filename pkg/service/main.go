package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Deps are the connections Main opens for a service.
type Deps struct {
	Pool    *pgxpool.Pool
	Metrics http.Handler // serves /metrics
	Log     *slog.Logger
}

// App is a wired service: the tasks to run, and what to release after. An
// App with no tasks (a one-shot role such as migrate) ends the process
// with status 0 once built.
type App interface {
	Tasks() []Task
	Close()
}

// Configured is what Main asks of a service's config struct: that it embeds
// Process (service.Process with the tag envPrefix:""), so the runner's deadline is
// loaded with everything else.
type Configured interface{ ProcessConfig() Process }

// Completer is an optional method of a config struct's pointer: Load
// calls Complete with the command line's arguments after the environment
// is read, for a service that takes arguments (a role) or checks its
// settings against each other. An error there is a configuration error.
type Completer interface{ Complete(args []string) error }

// DatabaseWaiter is an optional method of a config struct: how long Serve
// waits for the database to come up [DefaultDatabaseWait].
type DatabaseWaiter interface{ DatabaseWait() time.Duration }

// DefaultDatabaseWait is how long Serve waits for the database to come up
// when the config does not say.
const DefaultDatabaseWait = time.Minute

// Load reads the config C from the environment, checks its Process
// settings and, when *C is a Completer, completes it with args. The error
// holds every problem found, each naming its variable.
func Load[C Configured](args []string) (C, error) {
	cfg, err := LoadConfig[C]()
	if err != nil {
		return cfg, err
	}
	var l Limits
	l.Add(cfg.ProcessConfig().Validate())
	if c, ok := any(&cfg).(Completer); ok {
		l.Add(c.Complete(args))
	}
	if err := l.Err(); err != nil {
		return cfg, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

// Main is the whole main function of a service that has one database: it
// loads the config C (Load, with the process's arguments) and Serves it.
// Any error is logged and exits with status 1.
func Main[C Configured](name string, databaseURL func(C) string, build func(context.Context, C, Deps) (App, error)) {
	log := NewLogger(name)
	cfg, err := Load[C](os.Args[1:])
	if err != nil {
		Fatal(log, "bad configuration", err)
	}
	if err := Serve(context.Background(), name, cfg, log, databaseURL, build); err != nil {
		Fatal(log, "stopped", err)
	}
}

// Serve logs the config's summary, sets up telemetry, opens the database
// (waiting for it as DatabaseWaiter says), builds the app (which opens its
// own transports, such as an SQS client) and runs its tasks until SIGTERM
// or ctx's end. It is Main without the loading and the exit, for tests that
// run a whole service in their process.
func Serve[C Configured](ctx context.Context, name string, cfg C, log *slog.Logger, databaseURL func(C) string, build func(context.Context, C, Deps) (App, error)) error {
	LogConfig(log, cfg)
	extra, err := cfg.ProcessConfig().Tasks(log) // the process's own, beside the app's
	if err != nil {
		return err
	}
	tel, err := SetupTelemetry(name)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}()
	log.Info("telemetry", "trace_exporter", tel.Exporter)
	wait := DefaultDatabaseWait
	if w, ok := any(cfg).(DatabaseWaiter); ok && w.DatabaseWait() > 0 {
		wait = w.DatabaseWait()
	}
	pool, err := OpenPool(ctx, databaseURL(cfg), cfg.ProcessConfig().DBMaxConns, wait, log)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	// Past the shutdown deadline (or a second signal), tasks still running
	// hold connections, and closing the pool (or the app) would wait for
	// them: the process exits instead, and its end releases them, as a
	// crash's would.
	abandoned := false
	defer func() {
		if !abandoned {
			pool.Close()
		}
	}()
	app, err := build(ctx, cfg, Deps{Pool: pool, Metrics: tel.Metrics, Log: log})
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer func() {
		if !abandoned {
			app.Close()
		}
	}()
	err = Run(ctx, log, cfg.ProcessConfig().ShutdownTimeout, append(app.Tasks(), extra...)...)
	abandoned = errors.Is(err, ErrShutdownDeadline) || errors.Is(err, ErrShutdownCutShort)
	return err
}
