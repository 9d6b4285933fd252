package httpidem_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/httpidem"
)

// A crashed attempt is resumed in the same round however many older keys
// are due before it. 150 older keys whose outcome stays unknown (a
// provider still away) are due, and one newer key's attempt crashed: one
// Resume runs them all, in the order they fell due, the crash included.
// It used to take only the 100 keys created first, every round: the older
// unknown ones, released and due again a lease later, filled each round,
// and the crash was never resumed before its provider forgot the key.
func TestResumeReachesACrashBehindMoreThanARoundOfOlderKeys(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	s, pool := newStore(t, httpidem.Config{LockTimeout: lease})
	ctx := context.Background()
	for i := range 150 {
		if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, request_hash, request, resume_after, created_at)
			VALUES ('c POST /things', $1, 'h', '{}', now() - interval '1 minute', now() - interval '10 minutes')`,
			fmt.Sprintf("unknown-%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scope, key, request_hash, request, lock_token, locked_at, created_at)
		VALUES ('c POST /crashed', 'k', 'h', '{}', $1, now() - $2::interval, now() - interval '5 minutes')`, uuid.New(), lease+time.Second); err != nil {
		t.Fatal(err)
	}
	var order []string
	op := func(ctx context.Context, a *httpidem.Attempt, _ []byte) error {
		order = append(order, a.Scope())
		if a.Scope() == "c POST /crashed" {
			return a.Save(ctx, pool, http.StatusCreated, "ok")
		}
		return &httpidem.Error{Status: http.StatusBadGateway, Code: "provider_unavailable", OutcomeUnknown: true}
	}
	n, err := s.Resume(ctx, time.Hour, op)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || len(order) != 151 || order[150] != "c POST /crashed" {
		t.Fatalf("Resume finished %d after running %d operations (last %q); want all 151 run, the crash last, as it fell due last",
			n, len(order), order[len(order)-1])
	}
	// Run again at once: the unknown ones are due a lease after their
	// release, so nothing is run twice in a round.
	order = nil
	if _, err := s.Resume(ctx, time.Hour, op); err != nil || len(order) != 0 {
		t.Errorf("a second Resume at once ran %d operations (%v), want none due yet", len(order), err)
	}
}
