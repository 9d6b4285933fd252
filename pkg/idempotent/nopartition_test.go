package idempotent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// Migrate creates partitions a few days ahead; past them, only a running
// Maintainer keeps processed_messages able to hold a new key. A consumer
// without one fails each new message with an error that says so (and
// stays retryable: once the partition exists, the redelivery applies),
// not PostgreSQL's bare "no partition of relation".
func TestAMessageWithNoPartitionForItsDaySaysTheMaintainerIsMissing(t *testing.T) {
	pool := setup(t)
	later := time.Now().Add(time.Duration(idempotent.DefaultPartitionsAhead+1)*24*time.Hour + time.Hour)
	c, err := idempotent.NewConsumer(pool, "rewards", idempotent.WithNow(func() time.Time { return later }))
	if err != nil {
		t.Fatal(err)
	}
	e := newEvent(t, 100)
	e.EventID, e.OccurredAt = idAt(later), later.UTC().Truncate(time.Microsecond)
	for name, handle := range map[string]func() error{
		"Handle": func() error {
			_, err := c.Handle(context.Background(), idempotent.MessageOf(e), credit(e, 100))
			return err
		},
		"HandleBatch": func() error {
			_, errs := c.HandleBatch(context.Background(), []idempotent.Item{{Msg: idempotent.MessageOf(e), Effect: credit(e, 100)}})
			return errs[0]
		},
	} {
		err := handle()
		if err == nil || idempotent.IsPermanent(err) || !strings.Contains(err.Error(), "Maintainer") {
			t.Errorf("%s of a message whose day has no partition: %v (permanent %v); want a retryable error naming the Maintainer",
				name, err, idempotent.IsPermanent(err))
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 0 {
		t.Errorf("%d credits written", n)
	}
}
