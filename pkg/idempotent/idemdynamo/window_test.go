package idemdynamo_test

import (
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/idemdynamo"
)

// capture is a DynamoDB that accepts every write and keeps the last
// dedupe item written.
type capture struct {
	item map[string]types.AttributeValue
}

func (c *capture) TransactWriteItems(_ context.Context, in *dynamodb.TransactWriteItemsInput, _ ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	c.item = in.TransactItems[0].Put.Item
	return &dynamodb.TransactWriteItemsOutput{}, nil
}

func (c *capture) GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return &dynamodb.GetItemOutput{}, nil
}

// minted is an event whose id and occurred_at are at.
func minted(t *testing.T, at time.Time) idempotent.Message {
	t.Helper()
	e, err := events.New("PaymentSucceeded", "pay_1", 1, map[string]int{"amount_paise": 100})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7())
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(id[:6], ms[2:])
	e.EventID, e.OccurredAt = id, at.UTC().Truncate(time.Microsecond)
	return idempotent.MessageOf(e)
}

// The dedupe item outlives every copy the window still accepts, also for
// an event minted ahead of the consumer's clock: its TTL counted from the
// apply let DynamoDB forget the key while copies were still applied.
// An id minted past MaxFutureSkew is refused, as the PostgreSQL consumer
// refuses it.
func TestTheKeyOutlivesTheWindowOfAnEventFromAheadAndOneTooFarAheadIsRefused(t *testing.T) {
	api := &capture{}
	c, err := idemdynamo.NewConsumer(api, "rewards", idemdynamo.Config{})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context) ([]types.TransactWriteItem, error) { return nil, nil }
	msg := minted(t, time.Now().Add(2*24*time.Hour))
	if out, err := c.Handle(context.Background(), msg, noop); out != idempotent.Applied {
		t.Fatalf("an event 2 days ahead: %v, %v; want Applied", out, err)
	}
	secs, err := strconv.ParseInt(api.item[idemdynamo.AttrExpiresAt].(*types.AttributeValueMemberN).Value, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if gone := time.Unix(secs, 0); !msg.Expired(gone, idempotent.DefaultRetention) {
		t.Errorf("the key expires at %v, while a copy is still accepted", gone.UTC())
	}
	far := minted(t, time.Now().Add(idempotent.MaxFutureSkew+time.Hour))
	out, err := c.Handle(context.Background(), far, noop)
	if out != idempotent.Failed || !errors.Is(err, idempotent.ErrAhead) || !idempotent.IsPermanent(err) {
		t.Errorf("an event minted past MaxFutureSkew: %v, %v; want Failed with ErrAhead", out, err)
	}
}

// NewConsumer refuses a Retention the queue can outlast, as
// idempotent.NewConsumer does; QueueRetention names a shorter queue.
func TestNewConsumerRefusesAWindowTheQueueOutlasts(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	for _, tc := range []struct {
		cfg idemdynamo.Config
		ok  bool
	}{
		{idemdynamo.Config{}, true},
		{idemdynamo.Config{Retention: time.Hour}, false},
		{idemdynamo.Config{Retention: 14 * day}, false},
		{idemdynamo.Config{Retention: 5 * day, QueueRetention: 4 * day}, true},
	} {
		_, err := idemdynamo.NewConsumer(&capture{}, "rewards", tc.cfg)
		if tc.ok != (err == nil) {
			t.Errorf("Retention %v, QueueRetention %v: %v; want ok=%v", tc.cfg.Retention, tc.cfg.QueueRetention, err, tc.ok)
		}
	}
}
