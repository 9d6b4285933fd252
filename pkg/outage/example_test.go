package outage_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"syscall"

	"github.com/effectively-once/payments-cashback/pkg/outage"
)

// A consumer wires a Gate whose probe pings its database (here a stand-in
// that is down until told otherwise), reports each handler error to
// Suspect, and Waits before taking more work. In this project
// service.DatabaseGate builds it and SubscriberConfig.Gate uses it.
func ExampleGate() {
	var down atomic.Bool
	down.Store(true)
	ping := func(context.Context) error {
		if down.Load() {
			return syscall.ECONNREFUSED
		}
		return nil
	}
	g, _ := outage.NewGate(outage.GateConfig{Name: "database", Probe: ping, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := context.Background()

	fmt.Println("a bad payload is an outage:", g.Suspect(ctx, errors.New("amount_paise: must be > 0")))
	fmt.Println("a refused connection is an outage:", g.Suspect(ctx, fmt.Errorf("insert credit: %w", syscall.ECONNREFUSED)))
	fmt.Println("readiness:", g.Check(ctx))

	down.Store(false) // the database is back: the next Wait's probe reopens the gate
	fmt.Println("wait:", g.Wait(ctx), "closed:", g.Closed())
	// Output:
	// a bad payload is an outage: false
	// a refused connection is an outage: true
	// readiness: paused: database unreachable for 0s
	// wait: <nil> closed: false
}
