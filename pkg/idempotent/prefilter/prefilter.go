// Package prefilter puts Redis in front of an idempotent consumer as a
// cache of keys the database has already committed, never as the
// authority.
//
//	GET key                        hit with the same hash -> Duplicate, no database call
//	  miss, other hash, or error   -> the consumer's Handle decides (the database)
//	Applied or Duplicate           -> SET key hash EX window (after the commit)
//
// Why only this: a SET NX is not part of the database's transaction. Set
// before the commit, a crash between the two loses the message (the key
// says "done", the effect never committed); set instead of the database
// key, a crash after the effect lets the duplicate through. So the key is
// written only after the database said the effect is committed, and a
// missing key (never written, evicted, FLUSHALL, Redis restarted or down)
// only costs the database check it would have saved. A hit is trusted only
// when its hash equals the copy's: another hash goes to the database, which
// reports the Conflict.
//
// It pays off only when duplicates are common (a day-long replay, a
// producer that resends everything) and the database is the bottleneck: a
// new message costs one more round trip (the GET) and a write (the SET).
package prefilter

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// Handler is an idempotent consumer: idempotent.Consumer (E is
// idempotent.Effect), idemdynamo.Consumer (E is idemdynamo.Effect), or
// any other with the same contract.
type Handler[E any] interface {
	Name() string
	Handle(ctx context.Context, msg idempotent.Message, effect E) (idempotent.Outcome, error)
}

// Config configures a Consumer. Zero fields take their defaults.
type Config struct {
	// Window is the TTL of a recorded key, and copies older than it skip
	// the cache so that the consumer reports them Expired. Keep it equal to
	// the consumer's retention. Defaults to idempotent.DefaultRetention.
	Window time.Duration
	// Prefix starts every key: Prefix + consumer + ":" + event id.
	// Defaults to "idem:".
	Prefix string
	// Timeout bounds each Redis call, so a slow or unreachable Redis costs
	// each message at most this before the database decides. Defaults to
	// 100ms.
	Timeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Consumer is a Handler with the pre-filter in front. With a nil Redis
// client it is off: every message goes straight to the Handler.
type Consumer[E any] struct {
	next    Handler[E]
	rdb     redis.UniversalClient
	cfg     Config
	now     func() time.Time
	lookups metric.Int64Counter
}

// New returns next with the pre-filter on rdb in front (off if rdb is nil).
func New[E any](next Handler[E], rdb redis.UniversalClient, cfg Config) (*Consumer[E], error) {
	if cfg.Window <= 0 {
		cfg.Window = idempotent.DefaultRetention
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "idem:"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Consumer[E]{next: next, rdb: rdb, cfg: cfg, now: time.Now}
	var err error
	c.lookups, err = otel.Meter(otelScope).Int64Counter(
		"idempotent_prefilter_total",
		metric.WithDescription("Pre-filter lookups and records, by result (hit, miss, error, recorded, record_error)."))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Name is the wrapped consumer's name.
func (c *Consumer[E]) Name() string { return c.next.Name() }

// Key is the Redis key of msg's event id for this consumer.
func (c *Consumer[E]) Key(msg idempotent.Message) string {
	return c.cfg.Prefix + c.next.Name() + ":" + msg.EventID.String()
}

// Handle is the wrapped Handle with the same outcomes and guarantee. A
// Duplicate may come from Redis without a database call; every other
// outcome comes from the database.
func (c *Consumer[E]) Handle(ctx context.Context, msg idempotent.Message, effect E) (idempotent.Outcome, error) {
	if c.rdb == nil {
		return c.next.Handle(ctx, msg, effect)
	}
	if !msg.Expired(c.now(), c.cfg.Window) && c.seen(ctx, msg) {
		return idempotent.Duplicate, nil
	}
	out, err := c.next.Handle(ctx, msg, effect)
	if out.Done() {
		c.remember(ctx, msg)
	}
	return out, err
}

// seen reports a hit whose hash is the copy's; anything else is a miss.
func (c *Consumer[E]) seen(ctx context.Context, msg idempotent.Message) bool {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	v, err := c.rdb.Get(rctx, c.Key(msg)).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		c.count(ctx, "miss")
		return false
	case err != nil:
		c.count(ctx, "error")
		c.cfg.Logger.DebugContext(ctx, "pre-filter lookup failed: the database decides", "event_id", msg.EventID, "error", err)
		return false
	case string(v) != string(msg.Hash):
		c.count(ctx, "miss") // another payload: the database reports the conflict
		return false
	}
	c.count(ctx, "hit")
	return true
}

// remember records a committed key. A failure (or a crash before it) loses
// nothing but the next copy's shortcut.
func (c *Consumer[E]) remember(ctx context.Context, msg idempotent.Message) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.Timeout)
	defer cancel()
	if err := c.rdb.Set(rctx, c.Key(msg), msg.Hash, c.cfg.Window).Err(); err != nil {
		c.count(ctx, "record_error")
		c.cfg.Logger.DebugContext(ctx, "pre-filter record failed: the next copy asks the database", "event_id", msg.EventID, "error", err)
		return
	}
	c.count(ctx, "recorded")
}

func (c *Consumer[E]) count(ctx context.Context, result string) {
	c.lookups.Add(ctx, 1, metric.WithAttributes(attribute.String("consumer", c.next.Name()), attribute.String("result", result)))
}

// otelScope names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var otelScope = reflect.TypeFor[Config]().PkgPath()
