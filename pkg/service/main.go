package service

import (
	"context"
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

// App is a wired service: the tasks to run, and what to release after.
type App interface {
	Tasks() []Task
	Close()
}

// Configured is what Main asks of a service's config struct: that it embeds
// Process (service.Process with the tag envPrefix:""), so the runner's deadline is
// loaded with everything else.
type Configured interface{ ProcessConfig() Process }

// Main is the whole main function of a service that has one database: it
// loads the config C from the environment, sets up logs and telemetry,
// opens the database (waiting up to a minute for it), builds the app (which
// opens its own transports, such as an SQS client) and runs its tasks until
// SIGTERM. Any start-up
// error is logged and exits with status 1.
func Main[C Configured](name string, databaseURL func(C) string, build func(context.Context, C, Deps) (App, error)) {
	log := NewLogger(name)
	cfg, err := LoadConfig[C]()
	if err != nil {
		Fatal(log, "bad configuration", err)
	}
	LogConfig(log, cfg)
	tel, err := SetupTelemetry(name)
	if err != nil {
		Fatal(log, "telemetry", err)
	}
	log.Info("telemetry", "trace_exporter", tel.Exporter)
	ctx := context.Background()
	pool, err := OpenPool(ctx, databaseURL(cfg), time.Minute, log)
	if err != nil {
		Fatal(log, "database", err)
	}
	app, err := build(ctx, cfg, Deps{Pool: pool, Metrics: tel.Metrics, Log: log})
	if err != nil {
		Fatal(log, "start", err)
	}
	err = Run(ctx, log, cfg.ProcessConfig().ShutdownTimeout, app.Tasks()...)
	app.Close()
	pool.Close()
	_ = tel.Shutdown(context.Background())
	if err != nil {
		log.Error("stopped", "error", err)
		os.Exit(1)
	}
}
