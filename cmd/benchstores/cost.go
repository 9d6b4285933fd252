package main

import (
	"context"
	"fmt"
	"math"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/idemdynamo"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/prefilter"
)

// costSample is how many messages each cost case handles; the table shows
// the per-message mean of what was counted on the wire.
const costSample = 50

// itemSize is an item's size by DynamoDB's rules: each attribute's name
// (UTF-8 bytes) plus its value: strings their UTF-8 bytes, binary its
// bytes, numbers about one byte per two significant digits plus one.
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name)
		switch x := v.(type) {
		case *types.AttributeValueMemberS:
			n += len(x.Value)
		case *types.AttributeValueMemberB:
			n += len(x.Value)
		case *types.AttributeValueMemberN:
			n += (len(x.Value)+1)/2 + 1
		}
	}
	return n
}

// transactWCU is what one TransactWriteItems of items is billed, committed
// or cancelled: 2 write units per KB (rounded up) of each item; an Update
// is billed on the larger of the item before and after, here the item
// after (key + the attributes it sets).
func transactWCU(items []map[string]types.AttributeValue) float64 {
	w := 0.0
	for _, it := range items {
		w += 2 * math.Ceil(float64(itemSize(it))/1024)
	}
	return w
}

// dyItems returns, for one message, the three items its transaction
// writes, as sized for billing.
func dyItems(t dyTables, msg idempotent.Message) []map[string]types.AttributeValue {
	acts := t.creditActions(msg, 0)
	wallet := map[string]types.AttributeValue{"balance_paise": nv(1_000_000), "credits": nv(500)}
	for k, v := range acts[1].Update.Key {
		wallet[k] = v
	}
	return []map[string]types.AttributeValue{t.bareDedupe(msg).Put.Item, acts[0].Put.Item, wallet}
}

// measure runs f for costSample fresh messages and returns the mean round
// trips per message to PostgreSQL, DynamoDB and Redis.
func measure(ctx context.Context, e *env, mk func() idempotent.Message, f func(context.Context, idempotent.Message) (idempotent.Outcome, error), want idempotent.Outcome) (pg, dy, rd float64, err error) {
	msgs := make([]idempotent.Message, costSample)
	for i := range msgs {
		msgs[i] = mk()
	}
	p0, d0, r0 := e.pgTrips.Load(), e.dyTrips.Load(), e.redisTrips.Load()
	for _, m := range msgs {
		out, herr := f(ctx, m)
		if out != want {
			return 0, 0, 0, fmt.Errorf("%v (%v), want %v", out, herr, want)
		}
	}
	n := float64(costSample)
	return float64(e.pgTrips.Load()-p0) / n, float64(e.dyTrips.Load()-d0) / n, float64(e.redisTrips.Load()-r0) / n, nil
}

func benchCosts(ctx context.Context, e *env, rep *report) error {
	if err := pgTables(ctx, e); err != nil {
		return err
	}
	pgc, err := idempotent.NewConsumer(e.pool, "rewards")
	if err != nil {
		return err
	}
	pgH := func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
		return pgc.Handle(ctx, m, pgEffect(m, 0))
	}
	// applied returns a message already applied (with the pre-filter off,
	// so Redis does not know it).
	applied := func(h func(context.Context, idempotent.Message) (idempotent.Outcome, error)) func() idempotent.Message {
		return func() idempotent.Message {
			m := newMessage()
			if out, err := h(ctx, m); out != idempotent.Applied {
				panic(fmt.Sprintf("cost setup: %v %v", out, err))
			}
			return m
		}
	}
	type kase struct {
		store, name string
		mk          func() idempotent.Message
		h           func(context.Context, idempotent.Message) (idempotent.Outcome, error)
		want        idempotent.Outcome
		writes, wcu float64
		note        string
	}
	cases := []kase{
		{"PostgreSQL Consumer", "new message", newMessage, pgH, idempotent.Applied, 3, 0, "BEGIN, claim+hash read (one batch), 2 effect statements, COMMIT; one fsync"},
		{"PostgreSQL Consumer", "duplicate", applied(pgH), pgH, idempotent.Duplicate, 0, 0, "BEGIN, claim+hash read, ROLLBACK"},
	}
	if e.rdb != nil {
		pgf, err := prefilter.New[idempotent.Effect](pgc, e.rdb, prefilter.Config{})
		if err != nil {
			return err
		}
		pfH := func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
			return pgf.Handle(ctx, m, pgEffect(m, 0))
		}
		cases = append(cases,
			kase{"PostgreSQL + Redis", "new message", newMessage, pfH, idempotent.Applied, 3, 0, "GET miss, the database's path, SET after the commit"},
			kase{"PostgreSQL + Redis", "duplicate, key in Redis", applied(pfH), pfH, idempotent.Duplicate, 0, 0, "GET hit: no database call"},
			kase{"PostgreSQL + Redis", "duplicate, key lost", applied(pgH), pfH, idempotent.Duplicate, 0, 0, "GET miss, the database decides, SET"})
	}
	if e.dynamo != nil {
		t, err := newDyTables(ctx, e)
		if err != nil {
			return err
		}
		defer t.drop(ctx, e)
		dyc, err := t.consumer(e)
		if err != nil {
			return err
		}
		dyH := func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
			return dyc.Handle(ctx, m, func(context.Context) ([]types.TransactWriteItem, error) { return t.creditActions(m, 0), nil })
		}
		wcu := transactWCU(dyItems(t, newMessage()))
		cases = append(cases,
			kase{"DynamoDB Consumer", "new message", newMessage, dyH, idempotent.Applied, 3, wcu, "one TransactWriteItems of 3 items"},
			kase{"DynamoDB Consumer", "duplicate", applied(dyH), dyH, idempotent.Duplicate, 0, wcu, "cancelled by the dedupe item's condition: billed all the same"})
		if e.rdb != nil {
			dyf, err := prefilter.New[idemdynamo.Effect](dyc, e.rdb, prefilter.Config{})
			if err != nil {
				return err
			}
			dfH := func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
				return dyf.Handle(ctx, m, func(context.Context) ([]types.TransactWriteItem, error) { return t.creditActions(m, 0), nil })
			}
			cases = append(cases,
				kase{"DynamoDB + Redis", "new message", newMessage, dfH, idempotent.Applied, 3, wcu, "GET miss, the transaction, SET"},
				kase{"DynamoDB + Redis", "duplicate, key in Redis", applied(dfH), dfH, idempotent.Duplicate, 0, 0, "GET hit: no DynamoDB call, no write units"})
		}
	}
	for _, c := range cases {
		pg, dy, rd, err := measure(ctx, e, c.mk, c.h, c.want)
		if err != nil {
			return fmt.Errorf("%s, %s: %w", c.store, c.name, err)
		}
		rep.Costs = append(rep.Costs, costRow{Store: c.store, Case: c.name, DBTrips: pg + dy, RedisTrips: rd, Writes: c.writes, WCU: c.wcu, Note: c.note})
	}
	return nil
}
