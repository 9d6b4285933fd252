package idemdynamo_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/idemdynamo"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// fixture is a dedupe table and a counters table (id HASH, n ADDed by the
// effect) of one test, on moto.
type fixture struct {
	db       *dynamodb.Client
	dedupe   string
	counters string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	db := testenv.DynamoDB(t)
	ctx := context.Background()
	f := fixture{db: db, dedupe: testenv.UniqueName("dedupe-"), counters: testenv.UniqueName("counters-")}
	if err := idemdynamo.EnsureTable(ctx, db, f.dedupe); err != nil {
		t.Fatal(err)
	}
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(f.counters),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := idemdynamo.WaitActive(ctx, db, f.counters); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f fixture) consumer(t *testing.T, db idemdynamo.API) *idemdynamo.Consumer {
	t.Helper()
	if db == nil {
		db = f.db
	}
	c, err := idemdynamo.NewConsumer(db, "rewards", idemdynamo.Config{Table: f.dedupe})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// add is an effect that adds 1 to counter id, and counts its calls.
func (f fixture) add(id string, calls *int) idemdynamo.Effect {
	var mu sync.Mutex
	return func(ctx context.Context) ([]types.TransactWriteItem, error) {
		mu.Lock()
		*calls++
		mu.Unlock()
		return []types.TransactWriteItem{{Update: &types.Update{
			TableName:                 aws.String(f.counters),
			Key:                       map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: id}},
			UpdateExpression:          aws.String("ADD n :one"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
		}}}, nil
	}
}

func (f fixture) counter(t *testing.T, id string) int {
	t.Helper()
	out, err := f.db.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(f.counters), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: id}},
	})
	if err != nil {
		t.Fatal(err)
	}
	n, ok := out.Item["n"].(*types.AttributeValueMemberN)
	if !ok {
		return 0
	}
	v, err := strconv.Atoi(n.Value)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (f fixture) dedupeItem(t *testing.T, id uuid.UUID) map[string]types.AttributeValue {
	t.Helper()
	out, err := f.db.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(f.dedupe), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{
			idemdynamo.AttrConsumer: &types.AttributeValueMemberS{Value: "rewards"},
			idemdynamo.AttrEventID:  &types.AttributeValueMemberS{Value: id.String()},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

func newMsg(hash string) idempotent.Message {
	return idempotent.Message{EventID: uuid.Must(uuid.NewV7()), Hash: []byte(hash), OccurredAt: time.Now()}
}

// A new message commits its effect and its dedupe item together: the
// counter moved once, and the item holds the payload hash and an
// expires_at one window and the clock-skew margin after now (a replica
// whose clock lags still finds the key while it accepts copies).
func TestANewMessageCommitsItsEffectWithTheDedupeItem(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(t, nil)
	msg, calls := newMsg("h1"), 0
	out, err := c.Handle(context.Background(), msg, f.add("w", &calls))
	if out != idempotent.Applied || err != nil {
		t.Fatalf("Handle = %v, %v; want applied", out, err)
	}
	if got := f.counter(t, "w"); got != 1 {
		t.Fatalf("counter = %d, want 1", got)
	}
	item := f.dedupeItem(t, msg.EventID)
	if h, _ := item[idemdynamo.AttrHash].(*types.AttributeValueMemberB); h == nil || string(h.Value) != "h1" {
		t.Fatalf("dedupe item hash = %v, want h1", item[idemdynamo.AttrHash])
	}
	exp, _ := item[idemdynamo.AttrExpiresAt].(*types.AttributeValueMemberN)
	if exp == nil {
		t.Fatal("dedupe item has no expires_at")
	}
	secs, _ := strconv.ParseInt(exp.Value, 10, 64)
	want := time.Now().Add(idempotent.DefaultRetention + idempotent.ClockSkewMargin).Unix()
	if secs < want-60 || secs > want+60 {
		t.Fatalf("expires_at = %d, want about %d (now + the window + ClockSkewMargin)", secs, want)
	}
}

// A copy of an applied message is a Duplicate: acked, and its effect does
// not commit a second time.
func TestACopyIsADuplicateAndWritesNothing(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(t, nil)
	msg, calls := newMsg("h1"), 0
	if out, err := c.Handle(context.Background(), msg, f.add("w", &calls)); out != idempotent.Applied {
		t.Fatalf("first = %v, %v", out, err)
	}
	for range 3 {
		out, err := c.Handle(context.Background(), msg, f.add("w", &calls))
		if out != idempotent.Duplicate || err != nil || !out.Done() {
			t.Fatalf("copy = %v, %v; want duplicate, done", out, err)
		}
	}
	if got := f.counter(t, "w"); got != 1 {
		t.Fatalf("counter = %d after 4 copies, want 1", got)
	}
}

// The same event id with another payload is a Conflict: not applied, not
// done, a permanent error.
func TestTheSameIDWithAnotherPayloadIsAConflict(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(t, nil)
	msg, calls := newMsg("h1"), 0
	if out, _ := c.Handle(context.Background(), msg, f.add("w", &calls)); out != idempotent.Applied {
		t.Fatal("first copy not applied")
	}
	other := msg
	other.Hash = []byte("h2")
	out, err := c.Handle(context.Background(), other, f.add("w", &calls))
	if out != idempotent.Conflict || !errors.Is(err, idempotent.ErrConflict) || out.Done() || !idempotent.IsPermanent(err) {
		t.Fatalf("other payload = %v, %v; want conflict, permanent", out, err)
	}
	if got := f.counter(t, "w"); got != 1 {
		t.Fatalf("counter = %d, want 1", got)
	}
}

// A copy older than the window is Expired: refused before its effect is
// even built, nothing written.
func TestAMessageOlderThanTheWindowIsExpiredAndNotRun(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(t, nil)
	msg, calls := newMsg("h1"), 0
	msg.OccurredAt = time.Now().Add(-idempotent.DefaultRetention - time.Hour)
	out, err := c.Handle(context.Background(), msg, f.add("w", &calls))
	if out != idempotent.Expired || !errors.Is(err, idempotent.ErrExpired) {
		t.Fatalf("old copy = %v, %v; want expired", out, err)
	}
	if calls != 0 || f.counter(t, "w") != 0 || f.dedupeItem(t, msg.EventID) != nil {
		t.Fatalf("expired copy ran: calls %d, counter %d", calls, f.counter(t, "w"))
	}
}

// An effect whose own condition fails cancels the whole transaction: the
// outcome is Failed (not done, not permanent: the redelivery tries again),
// the error names the effect's action, and no dedupe item is left, so a
// later delivery whose condition holds applies it.
func TestAFailedEffectConditionIsAFailureAndLeavesNoKey(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(t, nil)
	msg, calls := newMsg("h1"), 0
	guarded := func(ctx context.Context) ([]types.TransactWriteItem, error) {
		calls++
		return []types.TransactWriteItem{{ConditionCheck: &types.ConditionCheck{
			TableName:           aws.String(f.counters),
			Key:                 map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "gate"}},
			ConditionExpression: aws.String("attribute_exists(id)"),
		}}, {Update: &types.Update{
			TableName:                 aws.String(f.counters),
			Key:                       map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "w"}},
			UpdateExpression:          aws.String("ADD n :one"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
		}}}, nil
	}
	out, err := c.Handle(context.Background(), msg, guarded)
	if out != idempotent.Failed || out.Done() || idempotent.IsPermanent(err) {
		t.Fatalf("Handle = %v, %v; want failed, retryable", out, err)
	}
	if i, ok := idemdynamo.EffectConditionFailed(err); !ok || i != 0 {
		t.Fatalf("EffectConditionFailed(%v) = %d, %v; want action 0", err, i, ok)
	}
	if calls != 1 {
		t.Fatalf("effect built %d times; a condition failure is not retried in place", calls)
	}
	if f.dedupeItem(t, msg.EventID) != nil || f.counter(t, "w") != 0 {
		t.Fatal("a cancelled transaction left writes behind")
	}
	// The gate opens; the redelivery applies the message.
	if _, err := f.db.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(f.counters),
		Item: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "gate"}}}); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Handle(context.Background(), msg, guarded); out != idempotent.Applied {
		t.Fatalf("redelivery = %v, %v; want applied", out, err)
	}
	if got := f.counter(t, "w"); got != 1 {
		t.Fatalf("counter = %d, want 1", got)
	}
}

// An effect that returns an error writes nothing, key included.
func TestAnEffectErrorWritesNothing(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(t, nil)
	msg := newMsg("h1")
	boom := errors.New("boom")
	out, err := c.Handle(context.Background(), msg, func(context.Context) ([]types.TransactWriteItem, error) { return nil, boom })
	if out != idempotent.Failed || !errors.Is(err, boom) {
		t.Fatalf("Handle = %v, %v; want failed with the effect's error", out, err)
	}
	if f.dedupeItem(t, msg.EventID) != nil {
		t.Fatal("dedupe item written although the effect failed")
	}
}

// An effect of more actions than a transaction holds is refused
// permanently, before any call.
func TestAnEffectTooLargeForOneTransactionIsRefusedPermanently(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(t, nil)
	msg := newMsg("h1")
	out, err := c.Handle(context.Background(), msg, func(context.Context) ([]types.TransactWriteItem, error) {
		return make([]types.TransactWriteItem, idemdynamo.MaxEffectActions+1), nil
	})
	if out != idempotent.Failed || !idempotent.IsPermanent(err) {
		t.Fatalf("Handle = %v, %v; want failed, permanent", out, err)
	}
}

// N concurrent copies of one event: exactly one is Applied, the others
// Duplicate, and the counter moved once.
func TestConcurrentCopiesApplyExactlyOnce(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(t, nil)
	msg := newMsg("h1")
	const n = 12
	outs := make([]idempotent.Outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			calls := 0
			var err error
			outs[i], err = c.Handle(context.Background(), msg, f.add("w", &calls))
			if err != nil {
				t.Errorf("copy %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	applied := 0
	for _, o := range outs {
		if o == idempotent.Applied {
			applied++
		} else if o != idempotent.Duplicate {
			t.Fatalf("outcome %v, want applied or duplicate", o)
		}
	}
	if applied != 1 || f.counter(t, "w") != 1 {
		t.Fatalf("applied %d, counter %d; want 1 and 1", applied, f.counter(t, "w"))
	}
}

// faulty cancels the first `conflicts` transactions with reason, before
// passing calls on; it can also drop the item from cancellation reasons, as
// a server that does not return it would.
type faulty struct {
	idemdynamo.API
	mu        sync.Mutex
	conflicts int
	reason    string
	noItem    bool
	calls     int
}

func (f *faulty) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	f.mu.Lock()
	f.calls++
	inject := f.conflicts > 0
	if inject {
		f.conflicts--
	}
	f.mu.Unlock()
	if inject {
		reasons := make([]types.CancellationReason, len(in.TransactItems))
		for i := range reasons {
			reasons[i].Code = aws.String("None")
		}
		reasons[0].Code = aws.String(f.reason)
		return nil, &types.TransactionCanceledException{Message: aws.String("injected"), CancellationReasons: reasons}
	}
	out, err := f.API.TransactWriteItems(ctx, in, opts...)
	var tce *types.TransactionCanceledException
	if f.noItem && errors.As(err, &tce) {
		for i := range tce.CancellationReasons {
			tce.CancellationReasons[i].Item = nil
		}
	}
	return out, err
}

// A transaction cancelled by TransactionConflict on the dedupe item (a
// concurrent transaction held it) is sent again and then applies.
func TestATransactionConflictIsRetriedInPlace(t *testing.T) {
	f := newFixture(t)
	api := &faulty{API: f.db, conflicts: 2, reason: "TransactionConflict"}
	c := f.consumer(t, api)
	msg, calls := newMsg("h1"), 0
	out, err := c.Handle(context.Background(), msg, f.add("w", &calls))
	if out != idempotent.Applied || err != nil {
		t.Fatalf("Handle = %v, %v; want applied after the conflicts", out, err)
	}
	if api.calls != 3 || f.counter(t, "w") != 1 {
		t.Fatalf("calls %d, counter %d; want 3 calls and 1", api.calls, f.counter(t, "w"))
	}
}

// Any other cancellation reason is a failure at once, to be retried by
// redelivery, never taken for a duplicate.
func TestAnotherCancellationReasonIsAFailureNotADuplicate(t *testing.T) {
	f := newFixture(t)
	api := &faulty{API: f.db, conflicts: 1, reason: "ValidationError"}
	c := f.consumer(t, api)
	msg, calls := newMsg("h1"), 0
	out, err := c.Handle(context.Background(), msg, f.add("w", &calls))
	var ce *idemdynamo.CancelledError
	if out != idempotent.Failed || !errors.As(err, &ce) || ce.Transient() || idempotent.IsPermanent(err) {
		t.Fatalf("Handle = %v, %v; want failed with a non-transient CancelledError", out, err)
	}
	if api.calls != 1 {
		t.Fatalf("sent %d times; want once", api.calls)
	}
	if out, _ := c.Handle(context.Background(), msg, f.add("w", &calls)); out != idempotent.Applied {
		t.Fatalf("redelivery = %v; want applied", out)
	}
}

// Where the server does not return the dedupe item with the cancellation,
// the consumer reads it, and still tells a duplicate from a conflict.
func TestWithoutTheItemInTheCancellationTheHashIsRead(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(t, &faulty{API: f.db, noItem: true})
	msg, calls := newMsg("h1"), 0
	if out, _ := c.Handle(context.Background(), msg, f.add("w", &calls)); out != idempotent.Applied {
		t.Fatal("not applied")
	}
	if out, err := c.Handle(context.Background(), msg, f.add("w", &calls)); out != idempotent.Duplicate {
		t.Fatalf("copy = %v, %v; want duplicate", out, err)
	}
	other := msg
	other.Hash = []byte("h2")
	if out, _ := c.Handle(context.Background(), other, f.add("w", &calls)); out != idempotent.Conflict {
		t.Fatalf("other payload = %v; want conflict", out)
	}
}

// EnsureTable can run again (several replicas starting), and turns TTL on
// for expires_at, so DynamoDB forgets keys after the window.
func TestEnsureTableIsIdempotentAndTurnsOnTTL(t *testing.T) {
	f := newFixture(t)
	if err := idemdynamo.EnsureTable(context.Background(), f.db, f.dedupe); err != nil {
		t.Fatalf("second EnsureTable: %v", err)
	}
	out, err := f.db.DescribeTimeToLive(context.Background(), &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(f.dedupe)})
	if err != nil {
		t.Fatal(err)
	}
	d := out.TimeToLiveDescription
	if d == nil || aws.ToString(d.AttributeName) != idemdynamo.AttrExpiresAt || d.TimeToLiveStatus != types.TimeToLiveStatusEnabled {
		t.Fatalf("TTL = %+v; want enabled on %s", d, idemdynamo.AttrExpiresAt)
	}
}
