// Package idemdynamo is the idempotent consumer on DynamoDB: the dedupe item
// and the message's effect go in ONE TransactWriteItems, the dedupe Put
// first, conditioned on attribute_not_exists.
//
//	TransactWriteItems [
//	  Put dedupe (consumer, event_id, payload_hash, expires_at)  IF attribute_not_exists(event_id)
//	  ...the effect's actions, as the handler returned them...
//	]
//	  committed                                   -> Applied
//	  cancelled, dedupe item ConditionalCheckFailed -> Duplicate (same hash) or Conflict (other hash)
//	  cancelled for any other reason              -> Failed: nothing written, retried
//
// It keeps the contract of idempotent.Consumer.Handle, with the outcomes of
// that package: for a message delivered any number of times, by any number
// of replicas, within the window, its effect commits at most once, and
// exactly once if some delivery's transaction commits. DynamoDB
// transactions are serializable, so two concurrent copies cannot both pass
// the condition: one commits and the other is cancelled (by the condition,
// or by TransactionConflict and then, retried, by the condition).
//
// What it does not do, and why:
//   - ClientRequestToken is not used as the dedupe key: DynamoDB remembers
//     it for 10 minutes, while redeliveries and redrives come days later.
//     The dedupe item is the key. The SDK fills in a token of its own for
//     each call, the same for its retries of that call: a retry of a
//     transaction that did commit comes back as a success (Applied, the
//     effect once). A later call, with another token (this package's own
//     retry, a redelivery), comes back cancelled by the dedupe item, as a
//     Duplicate. Either is acked.
//   - The effect is a list of write actions, not a function of a
//     transaction: DynamoDB has no interactive transactions. Whatever the
//     handler reads to build them is read outside the transaction; make the
//     actions themselves correct under concurrency (ADD for counters,
//     conditions for business keys).
//   - A transaction holds at most 100 actions, so an effect holds at most
//     MaxEffectActions; every action is billed as a transactional write
//     (two write units per KB of item), on cancellation too.
package idemdynamo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/retry"
)

// The dedupe table's attributes. The key schema is (consumer HASH,
// event_id RANGE); expires_at is the table's TTL attribute.
const (
	AttrConsumer    = "consumer"     // S: the consumer name, partition key
	AttrEventID     = "event_id"     // S: the event id, sort key
	AttrHash        = "payload_hash" // B: the content digest of the applied copy
	AttrProcessedAt = "processed_at" // S: RFC 3339, when it was applied
	AttrExpiresAt   = "expires_at"   // N: Unix seconds; DynamoDB's TTL deletes the item after it
)

// DefaultTable is the dedupe table's name when Config.Table is empty.
const DefaultTable = "processed_messages"

// MaxEffectActions is the most actions an effect may return: a
// TransactWriteItems holds 100, and one is the dedupe item.
const MaxEffectActions = 99

// Effect returns the write actions that apply a message. It may run more
// than once (a transaction cancelled by a conflict is rebuilt and sent
// again), and it must not write anything itself: only the returned actions
// commit, together with the dedupe item, or not at all.
type Effect func(ctx context.Context) ([]types.TransactWriteItem, error)

// API is the part of *dynamodb.Client the consumer uses.
type API interface {
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
}

// Config configures a Consumer. Zero fields take their defaults.
type Config struct {
	// Table is the dedupe table. Defaults to DefaultTable.
	Table string
	// Retention is the dedupe window: older copies are Expired, and each
	// dedupe item's expires_at is this far, plus idempotent.ClockSkewMargin,
	// after it was applied, or after the event's own time when that is later
	// (an event from a clock ahead: Message.AcceptedUntil), so a replica
	// whose clock lags by less than the margin never accepts a copy whose
	// item is gone. An id minted past idempotent.MaxFutureSkew is refused
	// (ErrAhead), as idempotent.Consumer refuses it. Defaults to
	// idempotent.DefaultRetention. NewConsumer refuses one that does not
	// exceed QueueRetention by a day (idempotent.ValidateRetention).
	Retention time.Duration
	// QueueRetention is the longest the source queue (and its DLQ) can
	// hand a message back. Defaults to idempotent.DefaultQueueRetention.
	QueueRetention time.Duration
	// MaxRetries bounds how often a transaction cancelled only by
	// TransactionConflict or throttling is sent again. Defaults to 5.
	MaxRetries uint
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Consumer deduplicates messages for one named consumer on DynamoDB. The
// name scopes the keys, as in idempotent.Consumer.
type Consumer struct {
	db       API
	name     string
	cfg      Config
	now      func() time.Time
	outcomes metric.Int64Counter
}

// NewConsumer returns a Consumer named name that keeps its keys in
// cfg.Table (see EnsureTable).
func NewConsumer(db API, name string, cfg Config) (*Consumer, error) {
	if name == "" {
		return nil, errors.New("idemdynamo: consumer name is empty")
	}
	if db == nil {
		return nil, errors.New("idemdynamo: NewConsumer needs a DynamoDB client")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.Retention <= 0 {
		cfg.Retention = idempotent.DefaultRetention
	}
	if cfg.QueueRetention <= 0 {
		cfg.QueueRetention = idempotent.DefaultQueueRetention
	}
	if err := idempotent.ValidateRetention(cfg.Retention, cfg.QueueRetention); err != nil {
		return nil, err
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 5
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Consumer{db: db, name: name, cfg: cfg, now: time.Now}
	var err error
	c.outcomes, err = otel.Meter(otelScope).Int64Counter(
		"idempotent_dynamodb_messages_total",
		metric.WithDescription("Messages seen by a DynamoDB idempotent consumer, by outcome (applied, duplicate, conflict, expired, failed)."))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Name is the consumer name that scopes the keys.
func (c *Consumer) Name() string { return c.name }

// Table is the dedupe table.
func (c *Consumer) Table() string { return c.cfg.Table }

// Handle applies effect for msg at most once per consumer. It returns:
//   - Applied, nil: the effect's actions committed with the dedupe item;
//   - Duplicate, nil: the item was there with the same hash; nothing written;
//   - Conflict, idempotent.ErrConflict: there with another hash; nothing written;
//   - Expired, idempotent.ErrExpired: older than the window; not run;
//   - Failed, err: the effect's error, or a cancellation for any reason but
//     the dedupe item's condition (a *CancelledError), or a call error;
//     nothing was written, so a redelivery tries again.
//
// Ack the message exactly when Outcome.Done() is true.
func (c *Consumer) Handle(ctx context.Context, msg idempotent.Message, effect Effect) (idempotent.Outcome, error) {
	out, err := c.handle(ctx, msg, effect)
	c.record(ctx, msg, out, err)
	return out, err
}

func (c *Consumer) handle(ctx context.Context, msg idempotent.Message, effect Effect) (idempotent.Outcome, error) {
	if effect == nil {
		return idempotent.Failed, idempotent.ErrNilEffect
	}
	if err := msg.Validate(); err != nil {
		return idempotent.Failed, err
	}
	now := c.now()
	if msg.Expired(now, c.cfg.Retention) {
		return idempotent.Expired, idempotent.ErrExpired
	}
	if err := msg.Ahead(now); err != nil {
		return idempotent.Failed, err
	}
	b := retry.Policy{Base: 5 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: 0.5}.BackOff()
	out, err := backoff.Retry(ctx, func() (idempotent.Outcome, error) {
		out, err := c.attempt(ctx, msg, effect)
		var ce *CancelledError
		if err != nil && !(errors.As(err, &ce) && ce.Transient()) {
			return out, backoff.Permanent(err)
		}
		return out, err
	}, backoff.WithBackOff(b), backoff.WithMaxTries(c.cfg.MaxRetries+1), backoff.WithMaxElapsedTime(0))
	var pe *backoff.PermanentError
	if errors.As(err, &pe) {
		err = pe.Unwrap()
	}
	if err != nil && (out == 0 || out.Done()) {
		out = idempotent.Failed
	}
	return out, err
}

// attempt builds the effect's actions and sends them with the dedupe item.
func (c *Consumer) attempt(ctx context.Context, msg idempotent.Message, effect Effect) (idempotent.Outcome, error) {
	actions, err := effect(ctx)
	if err != nil {
		return idempotent.Failed, err
	}
	if len(actions) > MaxEffectActions {
		return idempotent.Failed, idempotent.Permanent(fmt.Errorf(
			"idemdynamo: the effect returned %d actions; a transaction holds %d besides the dedupe item", len(actions), MaxEffectActions))
	}
	items := make([]types.TransactWriteItem, 0, 1+len(actions))
	items = append(items, c.dedupePut(msg))
	items = append(items, actions...)
	_, err = c.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	if err == nil {
		return idempotent.Applied, nil
	}
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return idempotent.Failed, fmt.Errorf("idemdynamo: TransactWriteItems: %w", err)
	}
	reasons := tce.CancellationReasons
	if len(reasons) > 0 && aws.ToString(reasons[0].Code) == "ConditionalCheckFailed" {
		// The key is committed: whatever else the transaction ran into, this
		// message was applied before.
		stored, ok := hashOf(reasons[0].Item)
		if !ok { // a server that does not return the item: read it
			stored, err = c.storedHash(ctx, msg)
			if err != nil {
				return idempotent.Failed, err
			}
		}
		if string(stored) != string(msg.Hash) {
			return idempotent.Conflict, idempotent.ErrConflict
		}
		return idempotent.Duplicate, nil
	}
	return idempotent.Failed, newCancelledError(reasons)
}

func (c *Consumer) dedupePut(msg idempotent.Message) types.TransactWriteItem {
	now := c.now()
	// Kept while any copy is accepted: Retention from now, or longer for
	// an event from a clock ahead, whose window ends later.
	expires := now.Add(c.cfg.Retention)
	if until := msg.AcceptedUntil(c.cfg.Retention); until.After(expires) {
		expires = until
	}
	return types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(c.cfg.Table),
		Item: map[string]types.AttributeValue{
			AttrConsumer:    &types.AttributeValueMemberS{Value: c.name},
			AttrEventID:     &types.AttributeValueMemberS{Value: msg.EventID.String()},
			AttrHash:        &types.AttributeValueMemberB{Value: msg.Hash},
			AttrProcessedAt: &types.AttributeValueMemberS{Value: now.UTC().Format(time.RFC3339Nano)},
			AttrExpiresAt:   &types.AttributeValueMemberN{Value: strconv.FormatInt(expires.Add(idempotent.ClockSkewMargin).Unix(), 10)},
		},
		ConditionExpression:                 aws.String("attribute_not_exists(" + AttrEventID + ")"),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}
}

func hashOf(item map[string]types.AttributeValue) ([]byte, bool) {
	if b, ok := item[AttrHash].(*types.AttributeValueMemberB); ok {
		return b.Value, true
	}
	return nil, false
}

// storedHash reads the committed dedupe item's hash (strongly consistent).
func (c *Consumer) storedHash(ctx context.Context, msg idempotent.Message) ([]byte, error) {
	out, err := c.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(c.cfg.Table),
		ConsistentRead: aws.Bool(true),
		Key:            c.key(msg),
	})
	if err != nil {
		return nil, fmt.Errorf("idemdynamo: read dedupe item: %w", err)
	}
	h, ok := hashOf(out.Item)
	if !ok {
		return nil, errors.New("idemdynamo: dedupe item condition failed but the item has no payload_hash")
	}
	return h, nil
}

func (c *Consumer) key(msg idempotent.Message) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		AttrConsumer: &types.AttributeValueMemberS{Value: c.name},
		AttrEventID:  &types.AttributeValueMemberS{Value: msg.EventID.String()},
	}
}

// CancelledError is a cancelled transaction whose dedupe item was not the
// reason: an effect action's condition failed, or the server refused an
// action. Nothing was written. Reasons[0] is the dedupe item's, Reasons[i]
// for i >= 1 the effect's action i-1.
type CancelledError struct {
	Reasons []types.CancellationReason
}

func newCancelledError(r []types.CancellationReason) *CancelledError {
	return &CancelledError{Reasons: r}
}

func (e *CancelledError) Error() string {
	s := "idemdynamo: transaction cancelled:"
	for i, r := range e.Reasons {
		if code := aws.ToString(r.Code); code != "" && code != "None" {
			s += fmt.Sprintf(" action %d %s", i, code)
		}
	}
	return s
}

// Transient reports whether only conflicts with other transactions or
// throttling cancelled it, so that sending it again can succeed.
func (e *CancelledError) Transient() bool {
	seen := false
	for _, r := range e.Reasons {
		switch aws.ToString(r.Code) {
		case "", "None":
		case "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded":
			seen = true
		default:
			return false
		}
	}
	return seen
}

// EffectConditionFailed reports whether err is a cancellation caused by the
// condition of the effect's action i (0-based, as the handler returned
// them): for example a business key that already exists.
func EffectConditionFailed(err error) (i int, ok bool) {
	var ce *CancelledError
	if !errors.As(err, &ce) {
		return 0, false
	}
	for j, r := range ce.Reasons {
		if j > 0 && aws.ToString(r.Code) == "ConditionalCheckFailed" {
			return j - 1, true
		}
	}
	return 0, false
}

func (c *Consumer) record(ctx context.Context, msg idempotent.Message, out idempotent.Outcome, err error) {
	c.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("consumer", c.name), attribute.String("outcome", out.String())))
	log := c.cfg.Logger
	switch out {
	case idempotent.Conflict:
		log.ErrorContext(ctx, "event id reused with a different payload: not applied", "consumer", c.name, "event_id", msg.EventID)
	case idempotent.Expired:
		log.ErrorContext(ctx, "message older than the dedupe window: refused, not applied",
			"consumer", c.name, "event_id", msg.EventID, "occurred_at", msg.OccurredAt, "retention", c.cfg.Retention)
	case idempotent.Failed:
		if idempotent.IsPermanent(err) {
			log.ErrorContext(ctx, "effect refused the message permanently: nothing written, to be parked",
				"consumer", c.name, "event_id", msg.EventID, "error", err)
			return
		}
		log.WarnContext(ctx, "effect failed: nothing written, left for redelivery", "consumer", c.name, "event_id", msg.EventID, "error", err)
	}
}

// otelScope names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var otelScope = reflect.TypeFor[Consumer]().PkgPath()
