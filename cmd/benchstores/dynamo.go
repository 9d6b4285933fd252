package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/idemdynamo"
)

// dyTables is one set of the cashback example's tables.
type dyTables struct{ dedupe, credits, wallets string }

var dyTableSeq int

// newDyTables creates fresh tables. Each round gets its own: moto copies
// every table a transaction touches on each TransactWriteItems, so a table
// that grows through a run would slow the later rounds.
func newDyTables(ctx context.Context, e *env) (dyTables, error) {
	dyTableSeq++
	p := fmt.Sprintf("bench-%s-%d-", e.run, dyTableSeq)
	t := dyTables{dedupe: p + "dedupe", credits: p + "credits", wallets: p + "wallets"}
	if err := idemdynamo.EnsureTable(ctx, e.dynamo, t.dedupe); err != nil {
		return t, err
	}
	for table, key := range map[string]string{t.credits: "payment_id", t.wallets: "user_id"} {
		if _, err := e.dynamo.CreateTable(ctx, &dynamodb.CreateTableInput{
			TableName:            aws.String(table),
			AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(key), AttributeType: types.ScalarAttributeTypeS}},
			KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(key), KeyType: types.KeyTypeHash}},
			BillingMode:          types.BillingModePayPerRequest,
		}); err != nil {
			return t, err
		}
		if err := idemdynamo.WaitActive(ctx, e.dynamo, table); err != nil {
			return t, err
		}
	}
	return t, nil
}

func (t dyTables) drop(ctx context.Context, e *env) {
	for _, n := range []string{t.dedupe, t.credits, t.wallets} {
		_, _ = e.dynamo.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(n)})
	}
}

func sv(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func nv(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// newMessage is event i of a run: a UUIDv7 id, a 32-byte hash like
// events.Envelope.Hash, a ₹1,200 payment of one of 40 users.
func newMessage() idempotent.Message {
	id := uuid.Must(uuid.NewV7())
	h := make([]byte, 32)
	copy(h, id[:])
	return idempotent.Message{EventID: id, Hash: h, OccurredAt: time.Now()}
}

// creditActions is the effect: the credit, conditioned on its payment, and
// the wallet's ADD (as examples/dynamocashback does).
func (t dyTables) creditActions(msg idempotent.Message, i int) []types.TransactWriteItem {
	pay := "pay_" + msg.EventID.String()
	user := fmt.Sprintf("u_%d", i%40)
	return []types.TransactWriteItem{
		{Put: &types.Put{
			TableName: aws.String(t.credits),
			Item: map[string]types.AttributeValue{
				"payment_id": sv(pay), "user_id": sv(user), "amount_paise": nv(2400),
				"payment_amount_paise": nv(120000), "rate_bp": nv(200), "event_id": sv(msg.EventID.String()),
				"occurred_at": sv(msg.OccurredAt.UTC().Format("2006-01-02T15:04:05.000000Z")),
			},
			ConditionExpression: aws.String("attribute_not_exists(payment_id)"),
		}},
		{Update: &types.Update{
			TableName:                 aws.String(t.wallets),
			Key:                       map[string]types.AttributeValue{"user_id": sv(user)},
			UpdateExpression:          aws.String("ADD balance_paise :amount, credits :one"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":amount": nv(2400), ":one": nv(1)},
		}},
	}
}

// bareDedupe is the dedupe Put the bare side writes by hand: the same item
// the consumer writes.
func (t dyTables) bareDedupe(msg idempotent.Message) types.TransactWriteItem {
	now := time.Now()
	return types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(t.dedupe),
		Item: map[string]types.AttributeValue{
			idemdynamo.AttrConsumer: sv("rewards"), idemdynamo.AttrEventID: sv(msg.EventID.String()),
			idemdynamo.AttrHash:        &types.AttributeValueMemberB{Value: msg.Hash},
			idemdynamo.AttrProcessedAt: sv(now.UTC().Format(time.RFC3339Nano)),
			idemdynamo.AttrExpiresAt:   nv(now.Add(idempotent.DefaultRetention).Unix()),
		},
		ConditionExpression: aws.String("attribute_not_exists(" + idemdynamo.AttrEventID + ")"),
	}}
}

func (t dyTables) consumer(e *env) (*idemdynamo.Consumer, error) {
	return idemdynamo.NewConsumer(e.dynamo, "rewards", idemdynamo.Config{Table: t.dedupe})
}

// benchDynamo: the consumer against a bare TransactWriteItems of the same
// three actions, one message at a time (moto applies one request at a time
// correctly; see testenv.DynamoDB), interleaved rounds.
func benchDynamo(ctx context.Context, e *env, o options, rep *report) error {
	per := o.duration / time.Duration(o.rounds)
	var bare, lib []float64
	for r := range o.rounds {
		sides := []string{"bare", "consumer"}
		if r%2 == 1 {
			sides = []string{"consumer", "bare"}
		}
		for _, side := range sides {
			t, err := newDyTables(ctx, e)
			if err != nil {
				return err
			}
			c, err := t.consumer(e)
			if err != nil {
				return err
			}
			n, began := 0, time.Now()
			for time.Since(began) < per {
				msg := newMessage()
				if side == "bare" {
					items := append([]types.TransactWriteItem{t.bareDedupe(msg)}, t.creditActions(msg, n)...)
					if _, err := e.dynamo.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items}); err != nil {
						return fmt.Errorf("bare TransactWriteItems: %w", err)
					}
				} else {
					i := n
					out, err := c.Handle(ctx, msg, func(context.Context) ([]types.TransactWriteItem, error) { return t.creditActions(msg, i), nil })
					if out != idempotent.Applied {
						return fmt.Errorf("consumer: %v, %w", out, errors.Join(err))
					}
				}
				n++
			}
			rate := float64(n) / time.Since(began).Seconds()
			if side == "bare" {
				bare = append(bare, rate)
			} else {
				lib = append(lib, rate)
			}
			t.drop(ctx, e)
		}
		progress("dynamodb round %d: bare %.0f, consumer %.0f msgs/s", r+1, bare[len(bare)-1], lib[len(lib)-1])
	}
	mb, ml := median(bare), median(lib)
	rep.Rows = append(rep.Rows,
		row{Name: "DynamoDB (moto): bare TransactWriteItems (dedupe + credit + wallet), 1 client", Value: mb, Unit: "msgs/s", Rounds: bare},
		row{Name: "DynamoDB (moto): idemdynamo.Consumer.Handle, new messages, 1 client", Value: ml, Unit: "msgs/s",
			Baseline: fmt.Sprintf("bare %.0f", mb), Ratio: ml / mb, Rounds: lib})
	return nil
}
