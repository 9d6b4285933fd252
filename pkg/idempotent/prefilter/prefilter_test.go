package prefilter_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/idemdynamo"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/prefilter"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// store is one database behind the pre-filter. Its effect adds one to the
// message's counter (so a double apply shows as 2) and runs hook, inside
// the transaction, before the commit.
type store struct {
	// handle builds the store's consumer behind a pre-filter on rdb (nil:
	// the pre-filter is off) and returns its Handle.
	handle func(rdb redis.UniversalClient) func(ctx context.Context, msg idempotent.Message, hook func() error) (idempotent.Outcome, error)
	// applied is how often msg's effect committed.
	applied func(msg idempotent.Message) int
	// reached counts the Handle calls that got to the database.
	reached *atomic.Int64
}

// counting counts the calls that reach a consumer.
type counting[E any] struct {
	prefilter.Handler[E]
	n *atomic.Int64
}

func (c counting[E]) Handle(ctx context.Context, msg idempotent.Message, e E) (idempotent.Outcome, error) {
	c.n.Add(1)
	return c.Handler.Handle(ctx, msg, e)
}

func postgresStore(t *testing.T) store {
	t.Helper()
	ctx := context.Background()
	pool := testenv.DB(t)
	if err := idempotent.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (event_id uuid PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	inner, err := idempotent.NewConsumer(pool, "rewards")
	if err != nil {
		t.Fatal(err)
	}
	reached := &atomic.Int64{}
	return store{
		reached: reached,
		handle: func(rdb redis.UniversalClient) func(context.Context, idempotent.Message, func() error) (idempotent.Outcome, error) {
			c, err := prefilter.New[idempotent.Effect](counting[idempotent.Effect]{inner, reached}, rdb, prefilter.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return func(ctx context.Context, msg idempotent.Message, hook func() error) (idempotent.Outcome, error) {
				return c.Handle(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, 1) ON CONFLICT (event_id) DO UPDATE SET n = effects.n + 1`, msg.EventID)
					if err == nil && hook != nil {
						err = hook()
					}
					return err
				})
			}
		},
		applied: func(msg idempotent.Message) int {
			var n int
			err := pool.QueryRow(ctx, `SELECT n FROM effects WHERE event_id = $1`, msg.EventID).Scan(&n)
			if errors.Is(err, pgx.ErrNoRows) {
				return 0
			}
			if err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

func dynamoStore(t *testing.T) store {
	t.Helper()
	ctx := context.Background()
	db := testenv.DynamoDB(t)
	dedupe, effects := testenv.UniqueName("dedupe-"), testenv.UniqueName("effects-")
	if err := idemdynamo.EnsureTable(ctx, db, dedupe); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(effects),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	}); err != nil {
		t.Fatal(err)
	}
	if err := idemdynamo.WaitActive(ctx, db, effects); err != nil {
		t.Fatal(err)
	}
	inner, err := idemdynamo.NewConsumer(db, "rewards", idemdynamo.Config{Table: dedupe})
	if err != nil {
		t.Fatal(err)
	}
	key := func(msg idempotent.Message) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: msg.EventID.String()}}
	}
	reached := &atomic.Int64{}
	return store{
		reached: reached,
		handle: func(rdb redis.UniversalClient) func(context.Context, idempotent.Message, func() error) (idempotent.Outcome, error) {
			c, err := prefilter.New[idemdynamo.Effect](counting[idemdynamo.Effect]{inner, reached}, rdb, prefilter.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return func(ctx context.Context, msg idempotent.Message, hook func() error) (idempotent.Outcome, error) {
				return c.Handle(ctx, msg, func(context.Context) ([]types.TransactWriteItem, error) {
					if hook != nil {
						if err := hook(); err != nil { // DynamoDB commits in the call that follows: this is before it
							return nil, err
						}
					}
					return []types.TransactWriteItem{{Update: &types.Update{
						TableName: aws.String(effects), Key: key(msg),
						UpdateExpression:          aws.String("ADD n :one"),
						ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
					}}}, nil
				})
			}
		},
		applied: func(msg idempotent.Message) int {
			out, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(effects), Key: key(msg), ConsistentRead: aws.Bool(true)})
			if err != nil {
				t.Fatal(err)
			}
			n, ok := out.Item["n"].(*types.AttributeValueMemberN)
			if !ok {
				return 0
			}
			v, _ := strconv.Atoi(n.Value)
			return v
		},
	}
}

// eachStore runs body on the PostgreSQL consumer and on the DynamoDB one,
// each with a Redis of its own.
func eachStore(t *testing.T, body func(t *testing.T, s store, r *testenv.RedisServer, rdb *redis.Client)) {
	for name, mk := range map[string]func(*testing.T) store{"postgres": postgresStore, "dynamodb": dynamoStore} {
		t.Run(name, func(t *testing.T) {
			r := testenv.Redis(t)
			s := mk(t)
			rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
			t.Cleanup(func() { _ = rdb.Close() })
			body(t, s, r, rdb)
		})
	}
}

func newMsg() idempotent.Message {
	return idempotent.Message{EventID: uuid.Must(uuid.NewV7()), Hash: []byte("h1"), OccurredAt: time.Now()}
}

func mustOutcome(t *testing.T, want idempotent.Outcome, out idempotent.Outcome, err error) {
	t.Helper()
	if out != want {
		t.Fatalf("outcome %v (%v), want %v", out, err, want)
	}
}

// After a commit the key is in Redis with the window as its TTL, and the
// next copy is a Duplicate that never reaches the database.
func TestACommittedKeyIsRecordedAndTheNextCopyStopsAtRedis(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s store, _ *testenv.RedisServer, rdb *redis.Client) {
		ctx := context.Background()
		h := s.handle(rdb)
		msg := newMsg()
		out, err := h(ctx, msg, nil)
		mustOutcome(t, idempotent.Applied, out, err)
		key := "idem:rewards:" + msg.EventID.String()
		if ttl := rdb.TTL(ctx, key).Val(); ttl < idempotent.DefaultRetention-time.Minute || ttl > idempotent.DefaultRetention {
			t.Fatalf("TTL of %s = %v, want the window %v", key, ttl, idempotent.DefaultRetention)
		}
		before := s.reached.Load()
		out, err = h(ctx, msg, nil)
		mustOutcome(t, idempotent.Duplicate, out, err)
		if s.reached.Load() != before {
			t.Fatal("a copy whose key is in Redis still reached the database")
		}
		if n := s.applied(msg); n != 1 {
			t.Fatalf("applied %d times, want 1", n)
		}
	})
}

// Off by default: with no Redis client every copy goes to the database,
// which still deduplicates.
func TestWithoutRedisThePrefilterIsOff(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s store, _ *testenv.RedisServer, _ *redis.Client) {
		h := s.handle(nil)
		msg := newMsg()
		if out, err := h(context.Background(), msg, nil); out != idempotent.Applied {
			t.Fatalf("outcome %v (%v), want applied", out, err)
		}
		if out, err := h(context.Background(), msg, nil); out != idempotent.Duplicate {
			t.Fatalf("outcome %v (%v), want duplicate", out, err)
		}
		if s.reached.Load() != 2 || s.applied(msg) != 1 {
			t.Fatalf("reached %d, applied %d; want 2 and 1", s.reached.Load(), s.applied(msg))
		}
	})
}

// Crash between the commit and the Redis write: Redis dies inside the
// transaction, the commit goes through, the record fails; Redis comes back
// empty. The copy misses Redis and the database says Duplicate: applied
// once, nothing lost.
func TestACrashBetweenCommitAndTheRedisWriteLeavesTheDatabaseToDecide(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s store, r *testenv.RedisServer, rdb *redis.Client) {
		ctx := context.Background()
		h := s.handle(rdb)
		msg := newMsg()
		out, err := h(ctx, msg, func() error { r.Stop(); return nil })
		mustOutcome(t, idempotent.Applied, out, err)
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		if n := rdb.Exists(ctx, "idem:rewards:"+msg.EventID.String()).Val(); n != 0 {
			t.Fatal("key in Redis although the record was lost")
		}
		before := s.reached.Load()
		out, err = h(ctx, msg, nil)
		mustOutcome(t, idempotent.Duplicate, out, err)
		if s.reached.Load() != before+1 || s.applied(msg) != 1 {
			t.Fatalf("reached the database %d times, applied %d; want 1 and 1", s.reached.Load()-before, s.applied(msg))
		}
		// The database's Duplicate re-records the key.
		if n := rdb.Exists(ctx, "idem:rewards:"+msg.EventID.String()).Val(); n != 1 {
			t.Fatal("the duplicate's key was not recorded again")
		}
	})
}

// A failed effect records nothing in Redis (a key set before the commit
// would lose the message): the redelivery is applied.
func TestAFailedEffectRecordsNothingSoTheRedeliveryApplies(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s store, _ *testenv.RedisServer, rdb *redis.Client) {
		ctx := context.Background()
		h := s.handle(rdb)
		msg := newMsg()
		out, err := h(ctx, msg, func() error { return errBoom })
		if out != idempotent.Failed || !errors.Is(err, errBoom) {
			t.Fatalf("failing effect = %v, %v; want failed", out, err)
		}
		if n := rdb.Exists(ctx, "idem:rewards:"+msg.EventID.String()).Val(); n != 0 {
			t.Fatal("a key was recorded for an effect that did not commit")
		}
		out, err = h(ctx, msg, nil)
		mustOutcome(t, idempotent.Applied, out, err)
		if n := s.applied(msg); n != 1 {
			t.Fatalf("applied %d times, want 1", n)
		}
	})
}

var errBoom = errors.New("boom")

// Redis loses every key mid-run (FLUSHALL, or eviction under maxmemory):
// the copies of all applied messages miss and are Duplicates from the
// database; new messages are applied; each effect committed exactly once.
func TestRedisLosingItsKeysMidRunLeavesTheDatabaseToDecide(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s store, _ *testenv.RedisServer, rdb *redis.Client) {
		ctx := context.Background()
		h := s.handle(rdb)
		var msgs []idempotent.Message
		for range 10 {
			m := newMsg()
			msgs = append(msgs, m)
			out, err := h(ctx, m, nil)
			mustOutcome(t, idempotent.Applied, out, err)
		}
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			msgs = append(msgs, newMsg())
		}
		for i, m := range msgs {
			out, err := h(ctx, m, nil)
			want := idempotent.Duplicate
			if i >= 10 {
				want = idempotent.Applied
			}
			mustOutcome(t, want, out, err)
		}
		for i, m := range msgs {
			if n := s.applied(m); n != 1 {
				t.Fatalf("message %d applied %d times, want 1", i, n)
			}
		}
	})
}

// Redis down: every copy goes to the database (each Redis call fails
// fast), new messages are applied and duplicates recognised; nothing is
// lost and nothing doubled.
func TestRedisDownLeavesTheDatabaseToDecide(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s store, r *testenv.RedisServer, rdb *redis.Client) {
		ctx := context.Background()
		h := s.handle(rdb)
		old := newMsg()
		if out, err := h(ctx, old, nil); out != idempotent.Applied {
			t.Fatalf("outcome %v (%v), want %v", out, err, idempotent.Applied)
		}
		r.Stop()
		fresh := newMsg()
		before := s.reached.Load()
		for _, c := range []struct {
			msg  idempotent.Message
			want idempotent.Outcome
		}{{old, idempotent.Duplicate}, {fresh, idempotent.Applied}, {fresh, idempotent.Duplicate}} {
			out, err := h(ctx, c.msg, nil)
			mustOutcome(t, c.want, out, err)
		}
		if s.reached.Load()-before != 3 || s.applied(old) != 1 || s.applied(fresh) != 1 {
			t.Fatalf("reached %d, applied %d and %d; want 3, 1, 1", s.reached.Load()-before, s.applied(old), s.applied(fresh))
		}
	})
}

// A key in Redis with another hash is not trusted: the copy goes to the
// database, which reports the Conflict.
func TestAHitWithAnotherHashGoesToTheDatabaseForTheConflict(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s store, _ *testenv.RedisServer, rdb *redis.Client) {
		ctx := context.Background()
		h := s.handle(rdb)
		msg := newMsg()
		if out, err := h(ctx, msg, nil); out != idempotent.Applied {
			t.Fatalf("outcome %v (%v), want %v", out, err, idempotent.Applied)
		}
		other := msg
		other.Hash = []byte("h2")
		out, err := h(ctx, other, nil)
		if out != idempotent.Conflict || !errors.Is(err, idempotent.ErrConflict) {
			t.Fatalf("other payload = %v, %v; want conflict from the database", out, err)
		}
	})
}

// A copy older than the window skips the cache, even with its key still in
// Redis, so that the consumer refuses it as Expired.
func TestAnExpiredCopySkipsTheCacheAndIsRefused(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s store, _ *testenv.RedisServer, rdb *redis.Client) {
		ctx := context.Background()
		h := s.handle(rdb)
		msg := newMsg()
		msg.OccurredAt = time.Now().Add(-idempotent.DefaultRetention - time.Hour)
		if err := rdb.Set(ctx, "idem:rewards:"+msg.EventID.String(), msg.Hash, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		out, err := h(ctx, msg, nil)
		if out != idempotent.Expired || !errors.Is(err, idempotent.ErrExpired) || s.applied(msg) != 0 {
			t.Fatalf("old copy = %v, %v; want expired, not applied", out, err)
		}
	})
}
