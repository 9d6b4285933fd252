package idempotent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// DropExpiredPartitions, called on a pool of the caller's (no
// lock_timeout), gives up on a partition whose lock a long transaction
// holds, as creating one does, instead of waiting for it while every new
// dedupe insert queues behind the DROP.
func TestDroppingAPartitionBehindALongTransactionGivesUpInsteadOfStallingConsumers(t *testing.T) {
	pool := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := time.Now().Add(-idempotent.DefaultRetention - idempotent.ClockSkewMargin - 3*24*time.Hour)
	if _, err := idempotent.EnsurePartitionsAt(ctx, pool, old, idempotent.DefaultRetention, 0); err != nil {
		t.Fatal(err)
	}
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(context.Background())
	if _, err := long.Exec(ctx, `SELECT count(*) FROM processed_messages`); err != nil { // holds ACCESS SHARE on every partition
		t.Fatal(err)
	}
	_, err = idempotent.DropExpiredPartitions(ctx, pool, idempotent.DefaultRetention)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55P03" {
		t.Fatalf("DropExpiredPartitions behind a long transaction: %v; want a lock timeout (55P03), not a wait", err)
	}
}
