package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/redis/go-redis/v9"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/idemdynamo"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/prefilter"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback/terms"
)

// RateBP is the cashback rate of this example, 2%. (The rewards service
// looks up the rate in force at occurred_at; the example keeps one.)
const RateBP = 200

// Tables names the example's three tables.
type Tables struct {
	Dedupe  string // idemdynamo's (consumer, event_id) items
	Wallets string // user_id HASH: balance_paise, credits
	Credits string // payment_id HASH: the business key, one credit per payment
}

// App credits cashback for PaymentSucceeded events, exactly once, on
// DynamoDB.
type App struct {
	db       *dynamodb.Client
	t        Tables
	consumer *prefilter.Consumer[idemdynamo.Effect]
	log      *slog.Logger
}

// NewApp returns the App. rdb nil leaves the Redis pre-filter off.
func NewApp(db *dynamodb.Client, t Tables, rdb redis.UniversalClient, log *slog.Logger) (*App, error) {
	if log == nil {
		log = slog.Default()
	}
	c, err := idemdynamo.NewConsumer(db, cashback.ConsumerName, idemdynamo.Config{Table: t.Dedupe, Logger: log})
	if err != nil {
		return nil, err
	}
	pf, err := prefilter.New[idemdynamo.Effect](c, rdb, prefilter.Config{Logger: log})
	if err != nil {
		return nil, err
	}
	return &App{db: db, t: t, consumer: pf, log: log}, nil
}

// Setup creates the three tables if missing (idempotent).
func Setup(ctx context.Context, db *dynamodb.Client, t Tables) error {
	if err := idemdynamo.EnsureTable(ctx, db, t.Dedupe); err != nil {
		return err
	}
	for table, key := range map[string]string{t.Wallets: "user_id", t.Credits: "payment_id"} {
		_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
			TableName:            aws.String(table),
			AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(key), AttributeType: types.ScalarAttributeTypeS}},
			KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(key), KeyType: types.KeyTypeHash}},
			BillingMode:          types.BillingModePayPerRequest,
		})
		var inUse *types.ResourceInUseException
		if err != nil && !errors.As(err, &inUse) {
			return fmt.Errorf("create table %s: %w", table, err)
		}
		if err := idemdynamo.WaitActive(ctx, db, table); err != nil {
			return err
		}
	}
	return nil
}

// HandleDelivery is the SQS subscriber's handler.
func (a *App) HandleDelivery(ctx context.Context, d sqstransport.Delivery) error {
	return a.Handle(ctx, d.Envelope)
}

// Handle applies e at most once: nil when its credit is committed, now or
// before (ack); a permanent error for what no redelivery fixes (park); any
// other error leaves it for redelivery.
func (a *App) Handle(ctx context.Context, e events.Envelope) error {
	if e.EventType != contract.PaymentSucceeded {
		return sqstransport.Permanent(fmt.Errorf("dynamocashback does not handle event type %q", e.EventType))
	}
	pay, err := terms.DecodeSucceeded(e)
	if err != nil {
		return sqstransport.Permanent(err)
	}
	amount, err := terms.Amount(pay.AmountPaise, RateBP)
	if err != nil {
		return sqstransport.Permanent(err)
	}
	msg := idempotent.MessageOf(e)
	out, err := a.consumer.Handle(ctx, msg, a.credit(e, pay, amount))
	if i, ok := idemdynamo.EffectConditionFailed(err); ok && i == 0 {
		// The payment is credited already, under another event id (a buggy
		// upstream): commit this event's key alone, so its copies are
		// duplicates, and credit nothing (the business key, rule 3).
		out, err = a.consumer.Handle(ctx, msg, func(context.Context) ([]types.TransactWriteItem, error) { return nil, nil })
		if out == idempotent.Applied {
			a.log.WarnContext(ctx, "payment already credited under another event id: no second credit",
				"event_id", e.EventID, "payment_id", pay.PaymentID)
		}
	}
	if !out.Done() {
		return err
	}
	if out == idempotent.Applied {
		a.log.InfoContext(ctx, "cashback credited", "event_id", e.EventID, "payment_id", pay.PaymentID, "amount_paise", amount)
	}
	return nil
}

// credit is the effect: the credit item, conditioned on its payment being
// new, and the wallet's balance and count moved with ADD, which is atomic
// on the item; both commit with the dedupe item or not at all.
func (a *App) credit(e events.Envelope, pay terms.PaymentPayload, amount int64) idemdynamo.Effect {
	return func(context.Context) ([]types.TransactWriteItem, error) {
		return []types.TransactWriteItem{
			{Put: &types.Put{
				TableName: aws.String(a.t.Credits),
				Item: map[string]types.AttributeValue{
					"payment_id":           s(pay.PaymentID),
					"user_id":              s(pay.UserID),
					"amount_paise":         n(amount),
					"payment_amount_paise": n(pay.AmountPaise),
					"rate_bp":              n(RateBP),
					"event_id":             s(e.EventID.String()),
					"occurred_at":          s(e.OccurredAt.UTC().Format("2006-01-02T15:04:05.000000Z")),
				},
				ConditionExpression: aws.String("attribute_not_exists(payment_id)"),
			}},
			{Update: &types.Update{
				TableName:                 aws.String(a.t.Wallets),
				Key:                       map[string]types.AttributeValue{"user_id": s(pay.UserID)},
				UpdateExpression:          aws.String("ADD balance_paise :amount, credits :one"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":amount": n(amount), ":one": n(1)},
			}},
		}, nil
	}
}

// Wallet is a user's balance and number of credits (strongly consistent).
func (a *App) Wallet(ctx context.Context, userID string) (balance, credits int64, err error) {
	out, err := a.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(a.t.Wallets), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"user_id": s(userID)},
	})
	if err != nil {
		return 0, 0, err
	}
	return num(out.Item["balance_paise"]), num(out.Item["credits"]), nil
}

func s(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func n(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

func num(v types.AttributeValue) int64 {
	if m, ok := v.(*types.AttributeValueMemberN); ok {
		x, _ := strconv.ParseInt(m.Value, 10, 64)
		return x
	}
	return 0
}
