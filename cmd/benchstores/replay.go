package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/idemdynamo"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/prefilter"
)

// pgEffect is the rewards-shaped effect on PostgreSQL: a credit row and
// the wallet's upsert (the bench's own tables).
func pgEffect(msg idempotent.Message, i int) idempotent.Effect {
	return func(ctx context.Context, tx pgx.Tx) error {
		user := "u_" + strconv.Itoa(i%40)
		if _, err := tx.Exec(ctx, `INSERT INTO credits (payment_id, user_id, amount_paise, event_id) VALUES ($1, $2, 2400, $3)`,
			"pay_"+msg.EventID.String(), user, msg.EventID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO wallets (user_id, balance_paise) VALUES ($1, 2400)
			ON CONFLICT (user_id) DO UPDATE SET balance_paise = wallets.balance_paise + 2400`, user)
		return err
	}
}

func pgTables(ctx context.Context, e *env) error {
	_, err := e.pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS credits (payment_id text PRIMARY KEY, user_id text NOT NULL, amount_paise bigint NOT NULL, event_id uuid NOT NULL);
		CREATE TABLE IF NOT EXISTS wallets (user_id text PRIMARY KEY, balance_paise bigint NOT NULL)`)
	return err
}

// seedRedis records msgs as the pre-filter would have after applying them.
func seedRedis[E any](ctx context.Context, e *env, pf *prefilter.Consumer[E], msgs []idempotent.Message) error {
	for i := 0; i < len(msgs); i += 1000 {
		p := e.rdb.Pipeline()
		for _, m := range msgs[i:min(i+1000, len(msgs))] {
			p.Set(ctx, pf.Key(m), m.Hash, idempotent.DefaultRetention)
		}
		if _, err := p.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

// replay handles every msg with workers goroutines, checks each outcome is
// want, and returns msgs/s.
func replay(ctx context.Context, msgs []idempotent.Message, workers int, want idempotent.Outcome, handle func(context.Context, idempotent.Message) (idempotent.Outcome, error)) (float64, error) {
	next := make(chan idempotent.Message)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	began := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range next {
				out, err := handle(ctx, m)
				if out != want {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("event %s: %v, %v; want %v", m.EventID, out, err, want)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, m := range msgs {
		next <- m
	}
	close(next)
	wg.Wait()
	return float64(len(msgs)) / time.Since(began).Seconds(), firstErr
}

// handler is one consumer's Handle, with the pre-filter or without.
type handler = func(context.Context, idempotent.Message) (idempotent.Outcome, error)

// offThenOn runs one interleaved round: measure with off, then on (the
// other order on odd rounds, so drift hits both sides alike), appending
// each rate to its side.
func offThenOn(round int, offs, ons *[]float64, off, on handler, measure func(handler) (float64, error)) error {
	sides := []bool{false, true}
	if round%2 == 1 {
		sides = []bool{true, false}
	}
	for _, withFilter := range sides {
		h, into := off, offs
		if withFilter {
			h, into = on, ons
		}
		rate, err := measure(h)
		if err != nil {
			return err
		}
		*into = append(*into, rate)
	}
	return nil
}

// replayBoth replays msgs in o.rounds chunks, each chunk with the
// pre-filter off and then on (the other order every other chunk), and adds
// the median rates of each side to rep.
func replayBoth(ctx context.Context, o options, rep *report, store string, msgs []idempotent.Message,
	off, on handler) error {
	var offs, ons []float64
	chunk := (len(msgs) + o.rounds - 1) / o.rounds
	for r := 0; r*chunk < len(msgs); r++ {
		part := msgs[r*chunk : min((r+1)*chunk, len(msgs))]
		if err := offThenOn(r, &offs, &ons, off, on, func(h handler) (float64, error) {
			return replay(ctx, part, o.workers, idempotent.Duplicate, h)
		}); err != nil {
			return err
		}
		progress("%s replay chunk %d (%d events): off %.0f, on %.0f msgs/s", store, r+1, len(part), offs[len(offs)-1], ons[len(ons)-1])
	}
	mOff, mOn := median(offs), median(ons)
	rep.Rows = append(rep.Rows,
		row{Name: fmt.Sprintf("%s: replay of %d applied events, pre-filter off, %d worker(s)", store, len(msgs), o.workers), Value: mOff, Unit: "msgs/s", Rounds: offs},
		row{Name: fmt.Sprintf("%s: the same replay, Redis pre-filter on", store), Value: mOn, Unit: "msgs/s",
			Baseline: fmt.Sprintf("off %.0f", mOff), Ratio: mOn / mOff, Rounds: ons})
	return nil
}

func benchReplay(ctx context.Context, e *env, o options, rep *report) error {
	if e.rdb == nil {
		return nil
	}
	// PostgreSQL: the keys as a run with the pre-filter on would have left
	// them: committed in processed_messages and recorded in Redis.
	if err := pgTables(ctx, e); err != nil {
		return err
	}
	pgc, err := idempotent.NewConsumer(e.pool, "rewards")
	if err != nil {
		return err
	}
	pgf, err := prefilter.New[idempotent.Effect](pgc, e.rdb, prefilter.Config{})
	if err != nil {
		return err
	}
	msgs := make([]idempotent.Message, o.replay)
	ids, hashes := make([]string, o.replay), make([][]byte, o.replay)
	for i := range msgs {
		msgs[i] = newMessage()
		ids[i], hashes[i] = msgs[i].EventID.String(), msgs[i].Hash
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, payload_hash)
		SELECT 'rewards', id, h FROM unnest($1::uuid[], $2::bytea[]) AS t(id, h)`, ids, hashes); err != nil {
		return fmt.Errorf("seed processed_messages: %w", err)
	}
	if err := seedRedis(ctx, e, pgf, msgs); err != nil {
		return err
	}
	err = replayBoth(ctx, o, rep, "PostgreSQL", msgs,
		func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
			return pgc.Handle(ctx, m, pgEffect(m, 0))
		},
		func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
			return pgf.Handle(ctx, m, pgEffect(m, 0))
		})
	if err != nil {
		return err
	}
	// New messages spread over the 40 wallets, as payments of many users do.
	if err := freshBoth(ctx, o, rep, "PostgreSQL", 1000,
		func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
			return pgc.Handle(ctx, m, pgEffect(m, int(m.EventID[15])))
		},
		func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
			return pgf.Handle(ctx, m, pgEffect(m, int(m.EventID[15])))
		}); err != nil {
		return err
	}
	if e.dynamo == nil || o.replayDy == 0 {
		return nil
	}

	t, err := newDyTables(ctx, e)
	if err != nil {
		return err
	}
	defer t.drop(ctx, e)
	dyc, err := t.consumer(e)
	if err != nil {
		return err
	}
	dyf, err := prefilter.New[idemdynamo.Effect](dyc, e.rdb, prefilter.Config{})
	if err != nil {
		return err
	}
	dmsgs := make([]idempotent.Message, o.replayDy)
	for i := range dmsgs {
		dmsgs[i] = newMessage()
	}
	if err := seedDynamo(ctx, e, t, dmsgs); err != nil {
		return err
	}
	if err := seedRedis(ctx, e, dyf, dmsgs); err != nil {
		return err
	}
	eff := func(m idempotent.Message) idemdynamo.Effect {
		return func(context.Context) ([]types.TransactWriteItem, error) { return t.creditActions(m, 0), nil }
	}
	// moto applies one request at a time correctly (see testenv.DynamoDB):
	// one worker. And it copies every table a transaction touches on each
	// call, so a cancelled transaction costs in proportion to the dedupe
	// table's size: hence a smaller replay (-replay-dynamodb) than on
	// PostgreSQL. On DynamoDB itself the replay's cost is the write units.
	od := o
	od.workers = 1
	return replayBoth(ctx, od, rep, "DynamoDB (moto)", dmsgs,
		func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
			return dyc.Handle(ctx, m, eff(m))
		},
		func(ctx context.Context, m idempotent.Message) (idempotent.Outcome, error) {
			return dyf.Handle(ctx, m, eff(m))
		})
}

// seedDynamo writes msgs' dedupe items with BatchWriteItem, 25 a call.
func seedDynamo(ctx context.Context, e *env, t dyTables, msgs []idempotent.Message) error {
	for i := 0; i < len(msgs); i += 25 {
		var reqs []types.WriteRequest
		for _, m := range msgs[i:min(i+25, len(msgs))] {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: t.bareDedupe(m).Put.Item}})
		}
		pending := map[string][]types.WriteRequest{t.dedupe: reqs}
		for len(pending) > 0 {
			out, err := e.dynamo.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
			if err != nil {
				return fmt.Errorf("seed dedupe items: %w", err)
			}
			pending = out.UnprocessedItems
		}
	}
	return nil
}

// freshBoth is what the pre-filter costs where it cannot help: perRound new
// messages with it off and as many with it on, in o.rounds interleaved
// rounds.
func freshBoth(ctx context.Context, o options, rep *report, store string, perRound int,
	off, on handler) error {
	var offs, ons []float64
	for r := range o.rounds {
		if err := offThenOn(r, &offs, &ons, off, on, func(h handler) (float64, error) {
			msgs := make([]idempotent.Message, perRound)
			for i := range msgs {
				msgs[i] = newMessage()
			}
			return replay(ctx, msgs, o.workers, idempotent.Applied, h)
		}); err != nil {
			return err
		}
	}
	mOff, mOn := median(offs), median(ons)
	rep.Rows = append(rep.Rows,
		row{Name: fmt.Sprintf("%s: new messages, pre-filter off, %d workers", store, o.workers), Value: mOff, Unit: "msgs/s", Rounds: offs},
		row{Name: fmt.Sprintf("%s: new messages, Redis pre-filter on", store), Value: mOn, Unit: "msgs/s",
			Baseline: fmt.Sprintf("off %.0f", mOff), Ratio: mOn / mOff, Rounds: ons})
	return nil
}
