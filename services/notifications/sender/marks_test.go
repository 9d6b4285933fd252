package sender_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/notifications/sms"
)

// barrier is a provider that holds every call until want calls have
// arrived, then lets them all answer at once, so their outcomes are
// recorded together; before answering it runs before(key) and then
// answers with verdict(key) (nil: sent through to the wrapped provider).
type barrier struct {
	sms.Provider
	want    int
	before  func(key string)
	verdict func(key string) error

	mu      sync.Mutex
	arrived int
	release chan struct{}
}

func newBarrier(p sms.Provider, want int) *barrier {
	return &barrier{Provider: p, want: want, release: make(chan struct{}),
		before: func(string) {}, verdict: func(string) error { return nil }}
}

func (b *barrier) Send(ctx context.Context, m sms.Message) (sms.Receipt, error) {
	b.mu.Lock()
	b.arrived++
	if b.arrived == b.want {
		close(b.release)
	}
	b.mu.Unlock()
	select {
	case <-b.release:
	case <-ctx.Done():
		return sms.Receipt{}, ctx.Err()
	}
	b.before(m.IdempotencyKey)
	if err := b.verdict(m.IdempotencyKey); err != nil {
		return sms.Receipt{}, err
	}
	return b.Provider.Send(ctx, m)
}

// The SENT marks of calls that finish together are written together, and
// mark exactly the rows whose calls were accepted: the rejected ones end
// FAILED, none is left SENDING, none is SENT without its own message id.
func TestGroupedSentMarksOnlyTheAcceptedRows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	evs := e.intents(8)
	rejected := map[string]bool{}
	for _, ev := range evs[:3] {
		rejected["sms:"+ev.EventID.String()] = true
	}
	b := newBarrier(e.client, len(evs))
	b.verdict = func(key string) error {
		if rejected[key] {
			return &sms.Error{Class: sms.Rejected, Err: errors.New("400 bad number")}
		}
		return nil
	}
	cfg := fast()
	cfg.SendTimeout, cfg.Lease = 2*time.Second, 5*time.Second
	cfg.Concurrency = len(evs)
	s := e.sender(b, cfg)
	if n, err := s.SendOnce(context.Background()); err != nil || n != len(evs) {
		t.Fatalf("SendOnce = %d, %v; want all %d", n, err, len(evs))
	}
	for _, ev := range evs {
		key := "sms:" + ev.EventID.String()
		r := e.row(ev)
		if rejected[key] {
			if r.Status != "FAILED" || r.MessageID != nil {
				t.Errorf("%s (rejected): %+v; want FAILED without a message id", key, r)
			}
			continue
		}
		d, ok := e.delivery(key)
		if !ok || r.Status != "SENT" || deref(r.MessageID) != d.MessageID {
			t.Errorf("%s (accepted): %+v; want SENT with the provider's message id %q", key, r, d.MessageID)
		}
	}
}

// A row taken over while its call was in flight (the reconciler gave it a
// new claim) is not overwritten by the original sender's SENT mark, even
// when that mark is written in one statement with other rows' marks,
// which are recorded.
func TestGroupedSentMarkLeavesATakenOverRowAlone(t *testing.T) {
	t.Parallel()
	e := setup(t)
	evs := e.intents(4)
	stolen := "sms:" + evs[0].EventID.String()
	b := newBarrier(e.client, len(evs))
	b.before = func(key string) {
		if key != stolen {
			return
		}
		// What ReconcileOnce does to a row past its lease.
		if _, err := e.pool.Exec(context.Background(), `UPDATE notifications
			SET claim_id = gen_random_uuid(), sending_since = now() WHERE idempotency_key = $1`, key); err != nil {
			t.Error(err)
		}
	}
	cfg := fast()
	cfg.SendTimeout, cfg.Lease = 2*time.Second, 5*time.Second
	cfg.Concurrency = len(evs)
	s := e.sender(b, cfg)
	if n, err := s.SendOnce(context.Background()); err != nil || n != len(evs) {
		t.Fatalf("SendOnce = %d, %v", n, err)
	}
	if r := e.row(evs[0]); r.Status != "SENDING" || r.MessageID != nil {
		t.Errorf("taken-over row: %+v; want SENDING under its new claim, untouched", r)
	}
	for _, ev := range evs[1:] {
		if r := e.row(ev); r.Status != "SENT" || r.MessageID == nil {
			t.Errorf("%s: %+v; want SENT", ev.EventID, r)
		}
	}
}

// holdOne is a provider whose call for one key hangs until released.
type holdOne struct {
	sms.Provider
	key     string
	release chan struct{}
}

func (h *holdOne) Send(ctx context.Context, m sms.Message) (sms.Receipt, error) {
	if m.IdempotencyKey == h.key {
		select {
		case <-h.release:
		case <-ctx.Done():
			return sms.Receipt{}, ctx.Err()
		}
	}
	return h.Provider.Send(ctx, m)
}

// Run refills a call slot as soon as its call is recorded: one slow call
// holds one slot, and the other rows go through the other slots meanwhile
// instead of waiting for it. Cancelling Run waits for the slow call and
// records it, leaving no row SENDING.
func TestRunDoesNotWaitForTheSlowestCall(t *testing.T) {
	t.Parallel()
	e := setup(t)
	evs := e.intents(10)
	// The first row claimed (claims go in id order) hangs.
	h := &holdOne{Provider: e.client, key: "sms:" + evs[0].EventID.String(), release: make(chan struct{})}
	cfg := fast()
	cfg.SendTimeout, cfg.Lease = 5*time.Second, 10*time.Second
	cfg.Concurrency = 2
	cfg.PollInterval = 10 * time.Millisecond
	s := e.sender(h, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	sent := func() int {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications WHERE status = 'SENT'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(3 * time.Second)
	for sent() < len(evs)-1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := sent(); n != len(evs)-1 {
		t.Errorf("%d SENT while one call hangs; want the other %d through the free slot", n, len(evs)-1)
	}
	if r := e.row(evs[0]); r.Status != "SENDING" {
		t.Errorf("the hanging row is %s, want SENDING", r.Status)
	}
	cancel()
	select {
	case <-done:
		t.Fatal("Run returned while a call was in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(h.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r := e.row(evs[0]); r.Status != "SENT" {
		t.Errorf("after shutdown the slow row is %s, want SENT (recorded before Run returned)", r.Status)
	}
}
