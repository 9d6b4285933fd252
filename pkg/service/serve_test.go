package service_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/service"
)

type serveConfig struct {
	service.Process `envPrefix:""`
	URL             string
}

type stuckApp struct{ tasks []service.Task }

func (a stuckApp) Tasks() []service.Task { return a.tasks }
func (stuckApp) Close()                  {}

// SHUTDOWN_TIMEOUT bounds the exit: a task still running at the deadline,
// in the middle of a transaction (it holds a pool connection and ignores
// its context), does not keep the process waiting for the pool to close.
// Serve returns the deadline's error naming the task, soon after the
// deadline; the process's end then releases the connection, as a crash's.
func TestServeReturnsAtTheShutdownDeadlineWhileATaskHoldsAConnection(t *testing.T) {
	cfg := serveConfig{Process: service.Process{ShutdownTimeout: 300 * time.Millisecond, DBMaxConns: 4,
		HTTPReadTimeout: time.Second, HTTPWriteTimeout: time.Second}, URL: testenv.DatabaseURL(t)}
	release := make(chan struct{})
	defer close(release)
	holding := make(chan struct{})
	build := func(_ context.Context, _ serveConfig, d service.Deps) (service.App, error) {
		return stuckApp{tasks: []service.Task{{Name: "stuck effect", Run: func(context.Context) error {
			conn, err := d.Pool.Acquire(context.Background())
			if err != nil {
				return err
			}
			defer conn.Release()
			close(holding)
			select {
			case <-release:
			case <-time.After(30 * time.Second):
			}
			return nil
		}}}}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- service.Serve(ctx, "test", cfg, slog.New(slog.DiscardHandler), func(c serveConfig) string { return c.URL }, build)
	}()
	select {
	case <-holding:
	case err := <-done:
		t.Fatalf("Serve returned before its task ran: %v", err)
	}
	t0 := time.Now()
	cancel()
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, service.ErrShutdownDeadline) || !strings.Contains(err.Error(), "stuck effect") {
			t.Errorf("Serve: %v; want the shutdown deadline's error naming the stuck task", err)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("Serve returned %v after the stop, want soon after the 300ms deadline", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve still waiting 15 s after the stop, with a 300ms SHUTDOWN_TIMEOUT")
	}
}
