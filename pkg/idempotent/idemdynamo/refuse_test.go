package idemdynamo_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/idemdynamo"
)

// The DynamoDB consumer refuses what the PostgreSQL one refuses, before
// any write: a key it cannot keep (not a UUIDv7, no hash) and a nil
// effect, each a permanent error; and it is not built without a client.
func TestHandleRefusesWhatItCannotKeep(t *testing.T) {
	if _, err := idemdynamo.NewConsumer(nil, "rewards", idemdynamo.Config{}); err == nil || !strings.Contains(err.Error(), "needs a DynamoDB client") {
		t.Errorf("NewConsumer(nil): %v; want an error saying it needs a client", err)
	}
	f := newFixture(t)
	c := f.consumer(t, nil)
	e, err := events.New("PaymentSucceeded", "pay_1", 1, map[string]int{"amount_paise": 100})
	if err != nil {
		t.Fatal(err)
	}
	v4 := idempotent.MessageOf(e)
	v4.EventID = uuid.New()
	noHash := idempotent.MessageOf(e)
	noHash.Hash = nil
	calls := 0
	for name, m := range map[string]idempotent.Message{"v4 id": v4, "no hash": noHash} {
		out, err := c.Handle(context.Background(), m, f.add("c", &calls))
		if out != idempotent.Failed || !errors.Is(err, idempotent.ErrInvalidMessage) || !idempotent.IsPermanent(err) {
			t.Errorf("%s: %v, %v; want Failed and a permanent ErrInvalidMessage", name, out, err)
		}
	}
	out, err := c.Handle(context.Background(), idempotent.MessageOf(e), nil)
	if out != idempotent.Failed || !errors.Is(err, idempotent.ErrNilEffect) {
		t.Errorf("nil effect: %v, %v; want Failed, ErrNilEffect", out, err)
	}
	if calls != 0 || f.counter(t, "c") != 0 {
		t.Fatalf("the effect ran %d times, the counter is %d; want neither", calls, f.counter(t, "c"))
	}
	for _, id := range []uuid.UUID{v4.EventID, e.EventID} {
		if item := f.dedupeItem(t, id); len(item) != 0 {
			t.Fatalf("a dedupe item for %s was written: %v", id, item)
		}
	}
}
