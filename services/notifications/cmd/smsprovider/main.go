// Command smsprovider is a TEST DOUBLE of an SMS provider, for development
// and tests only: it delivers nothing to any phone (see package
// services/notifications/smsprovider: idempotency keys, lookup by key,
// fault injection and a list of what it "delivered", all in memory).
//
//	SMS_PROVIDER_PORT=8090 SMS_PROVIDER_API_KEYS=ops/read+admin:$(openssl rand -hex 24),notifications/send:$(openssl rand -hex 24) \
//	  go run ./services/notifications/cmd/smsprovider
//
// It binds LISTEN_ADDR (default 127.0.0.1) and refuses an address that is
// not loopback unless SMS_PROVIDER_ALLOW_REMOTE=true (as in a container,
// where the notifications service calls it over the network).
// SMS_PROVIDER_API_KEYS ("name[/read+admin+send]:key,...", an entry
// without roles may read) guards every route but /healthz, /readyz and
// /metrics (OTEL_* variables as on the services): the sender's
// /v1/messages (send; the notifications service's SMS_PROVIDER_API_KEY),
// its deliveries (read) and fault injection (admin); some client must hold
// each of the three.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/notifications/smsprovider"
)

type config struct {
	service.Process `envPrefix:""` // DB_MAX_CONNS, SHUTDOWN_TIMEOUT, HTTP_*_TIMEOUT, PPROF_ADDR, LOG_LEVEL

	Port        string            `env:"SMS_PROVIDER_PORT" envDefault:"8090"`
	ListenAddr  string            `env:"LISTEN_ADDR"`
	AllowRemote bool              `env:"SMS_PROVIDER_ALLOW_REMOTE"`
	Access      service.AccessEnv `envPrefix:"SMS_PROVIDER_"`
}

func main() {
	log := service.NewLogger("smsprovider")
	cfg, err := service.Load[config](nil) // the Process settings checked too
	if err != nil {
		service.Fatal(log, "bad configuration", err)
	}
	service.LogConfig(log, cfg)
	tel, err := service.SetupTelemetry("smsprovider")
	if err != nil {
		service.Fatal(log, "telemetry", err)
	}
	addr, h, err := build(cfg, log, tel.Metrics)
	if err != nil {
		service.Fatal(log, "bad configuration", err)
	}
	log.Warn("TEST DOUBLE: development SMS provider; it sends nothing to any phone and keeps messages in memory. Never use it in production",
		"addr", addr)
	ts, err := tasks(cfg, addr, h, log)
	if err != nil {
		service.Fatal(log, "bad configuration", err)
	}
	err = service.Run(context.Background(), log, cfg.ShutdownTimeout, ts...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if serr := tel.Shutdown(ctx); serr != nil {
		log.Warn("telemetry shutdown", "error", serr)
	}
	cancel()
	if err != nil {
		service.Fatal(log, "stopped", err)
	}
}

// tasks are the process's parts: the API on addr, and the tasks every
// service runs beside its own (Go's profiles on PPROF_ADDR when it is set).
func tasks(cfg config, addr string, h http.Handler, log *slog.Logger) ([]service.Task, error) {
	extra, err := cfg.Process.Tasks(log)
	if err != nil {
		return nil, err
	}
	return append([]service.Task{service.HTTPTask(addr, h, log, cfg.HTTP())}, extra...), nil
}

// build checks cfg and returns the address to listen on and the handler,
// which logs to log and serves metrics on /metrics.
func build(cfg config, log *slog.Logger, metrics http.Handler) (string, http.Handler, error) {
	addr, err := service.ListenAddrOf("SMS_PROVIDER_PORT", cfg.ListenAddr, cfg.Port)
	if err != nil {
		return "", nil, err
	}
	if !service.Loopback(addr) && !cfg.AllowRemote {
		return "", nil, fmt.Errorf("listen address %s is not loopback: this test double accepts fault injection and shows every message; "+
			"bind 127.0.0.1, or set SMS_PROVIDER_ALLOW_REMOTE=true where it must be reachable (a container network)", addr)
	}
	access, err := cfg.Access.Parse("SMS_PROVIDER_", smsprovider.Needs, service.RoleRead)
	if err != nil {
		return "", nil, err
	}
	h, err := smsprovider.New().Handler(log, metrics, access)
	if err != nil {
		return "", nil, err
	}
	return addr, h, nil
}
