package service_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"

	"github.com/effectively-once/payments-cashback/pkg/service"
)

// Every service's router answers /healthz, /readyz (each check within 2 s)
// and /metrics; the service adds its own routes.
func ExampleNewRouter() {
	log := slog.New(slog.DiscardHandler)
	r := service.NewRouter(log, nil, map[string]service.Check{
		"database": func(context.Context) error { return nil },
		"sqs payments-events": func(context.Context) error {
			return errors.New("queue payments-events: not found")
		},
	})
	for _, path := range []string{"/healthz", "/readyz"} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		fmt.Print(path, " ", w.Code, " ", w.Body.String())
	}
	// Output:
	// /healthz 200 {"status":"ok"}
	// /readyz 503 {"database":"ok","sqs payments-events":"failing"}
}

// Run runs a service's tasks until SIGTERM or until one fails; then it
// cancels the rest and waits for them to drain, up to the deadline.
func ExampleRun() {
	log := slog.New(slog.DiscardHandler)
	err := service.Run(context.Background(), log, 0,
		service.Task{Name: "relay", Run: func(ctx context.Context) error { <-ctx.Done(); return nil }},
		service.Task{Name: "consumer", Run: func(context.Context) error { return errors.New("queue gone") }})
	fmt.Println(err)
	// Output:
	// consumer: queue gone
}
