package sender_test

import (
	"context"
	"log/slog"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/outage"
	"github.com/effectively-once/payments-cashback/services/notifications/sms"
)

// downProvider refuses every call and every ping, as an unreachable
// server does, until up is set; then it accepts.
type downProvider struct {
	up    atomic.Bool
	calls atomic.Int64
}

func (p *downProvider) Send(_ context.Context, m sms.Message) (sms.Receipt, error) {
	p.calls.Add(1)
	if !p.up.Load() {
		return sms.Receipt{}, &sms.Error{Class: sms.Retryable, Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	}
	return sms.Receipt{MessageID: "m-" + m.IdempotencyKey}, nil
}

func (p *downProvider) Ping(context.Context) error {
	if !p.up.Load() {
		return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	return nil
}

// A provider outage holds the messages back instead of spending their
// attempts. With MaxAttempts 1, the first refused call would fail the
// message for good; with the gate, its probe confirms the outage, the row
// goes back to PENDING with the attempt not counted, nothing more is
// claimed while the provider is down, and once it answers the message is
// sent, on its first counted attempt.
func TestProviderOutageHoldsMessagesBackWithoutSpendingAttempts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := &downProvider{}
	gate, err := outage.NewGate(outage.GateConfig{Name: "sms provider", Probe: p.Ping,
		ProbeBase: 20 * time.Millisecond, ProbeMax: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fast()
	cfg.MaxAttempts, cfg.Gate, cfg.PollInterval = 1, gate, 20*time.Millisecond
	s := e.sender(p, cfg)
	ev := e.intent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(5 * time.Second)
	for p.calls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // polls and probes while the provider is down
	if st := e.row(ev); st.Status != "PENDING" || st.Attempts != 0 || st.Last == nil {
		t.Fatalf("while the provider is down: %+v; want PENDING, attempts 0, the refusal as last_error", st)
	}
	if !gate.Closed() {
		t.Error("the gate is open while the provider is down")
	}
	if n := p.calls.Load(); n != 1 {
		t.Errorf("provider calls while it is down: %d, want 1 (nothing claimed while the gate is closed)", n)
	}

	p.up.Store(true)
	deadline = time.Now().Add(5 * time.Second)
	for e.row(ev).Status != "SENT" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := e.row(ev); st.Status != "SENT" || st.Attempts != 1 {
		t.Errorf("once the provider answers: %+v; want SENT on attempt 1", st)
	}
}

// A failure the probe does not confirm is the message's own: a provider
// that answers its health check but fails the call (here, refuses the
// connection for that call only) leaves the gate open, and the attempt
// counts as ever.
func TestAFailureTheProbeDoesNotConfirmSpendsTheAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	p := &downProvider{}
	gate, err := outage.NewGate(outage.GateConfig{Name: "sms provider", Probe: func(context.Context) error { return nil },
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fast()
	cfg.MaxAttempts, cfg.Gate = 1, gate
	s := e.sender(p, cfg)
	ev := e.intent()
	if n, err := s.SendOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("SendOnce: %d, %v", n, err)
	}
	if st := e.row(ev); st.Status != "FAILED" || st.Attempts != 1 {
		t.Errorf("after one refused call with the provider healthy: %+v; want FAILED after its one attempt", st)
	}
	if gate.Closed() {
		t.Error("the gate closed though its probe succeeds")
	}
}
