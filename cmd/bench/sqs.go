package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/effectively-once/payments-cashback/internal/sqscount"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/inboxsqs"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// The relay's defaults: RelayConfig.Workers 2 sharing NewPublisher's
// DefaultInFlight (8) SendMessageBatch calls in flight; publisherCalls is
// the half of it that the bare baseline is also measured at.
const (
	relayWorkers   = 2
	relayInFlight  = sqstransport.DefaultInFlight
	publisherCalls = relayInFlight / 2
)

type sqsEnv struct {
	client *sqs.Client
	run    string

	mu     sync.Mutex
	queues []string
}

func newSQSEnv(ctx context.Context, run string) (*sqsEnv, error) {
	c, err := sqstransport.NewClient(ctx)
	if err != nil {
		return nil, err
	}
	return &sqsEnv{client: c, run: run}, nil
}

// queue creates bench-<run>-<name> and its DLQ; delete removes them.
func (e *sqsEnv) queue(ctx context.Context, name string, visibility time.Duration) (url string, del func(), err error) {
	full := "bench-" + e.run + "-" + name
	q, dlq, err := sqstransport.EnsureQueue(ctx, e.client, full, 5, visibility)
	if err != nil {
		return "", nil, err
	}
	e.mu.Lock()
	e.queues = append(e.queues, q, dlq)
	e.mu.Unlock()
	return q, func() { e.deleteQueues(q, dlq) }, nil
}

func (e *sqsEnv) deleteQueues(urls ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, u := range urls {
		if _, err := e.client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(u)}); err != nil {
			var missing *types.QueueDoesNotExist
			if !errors.As(err, &missing) {
				progress("warning: delete queue %s: %v", u, err)
			}
		}
		e.mu.Lock()
		for i, q := range e.queues {
			if q == u {
				e.queues = append(e.queues[:i], e.queues[i+1:]...)
				break
			}
		}
		e.mu.Unlock()
	}
}

func (e *sqsEnv) close() {
	e.mu.Lock()
	left := append([]string(nil), e.queues...)
	e.mu.Unlock()
	e.deleteQueues(left...)
}

// relayMessages builds n messages shaped like the relay's: the envelope as
// body and the event_id, event_type and traceparent attributes.
func relayMessages(n int) ([]outbox.Message, error) {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		cr, err := newCredit()
		if err != nil {
			return nil, err
		}
		body, err := cr.env.Marshal()
		if err != nil {
			return nil, err
		}
		msgs[i] = outbox.Message{EventID: cr.env.EventID, Body: body, Attributes: map[string]string{
			"event_id": cr.env.EventID.String(), "event_type": cr.env.EventType,
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	}
	return msgs, nil
}

func sendEntries(msgs []outbox.Message) []types.SendMessageBatchRequestEntry {
	out := make([]types.SendMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		attrs := make(map[string]types.MessageAttributeValue, len(m.Attributes))
		for k, v := range m.Attributes {
			attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
		out[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(m.Body)), MessageAttributes: attrs}
	}
	return out
}

// bareSend puts msgs on q with bare SendMessageBatch calls of 10, inFlight
// at once, and returns how long that took.
func bareSend(ctx context.Context, c *sqs.Client, q string, msgs []outbox.Message, inFlight int) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var first error
	start := time.Now()
	for range inFlight {
		wg.Go(func() {
			for {
				i := int(next.Add(10)) - 10
				if i >= len(msgs) || ctx.Err() != nil {
					return
				}
				out, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q), Entries: sendEntries(msgs[i:min(i+10, len(msgs))])})
				if err == nil && len(out.Failed) > 0 {
					err = fmt.Errorf("SendMessageBatch: %d entries failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
				}
				if err != nil {
					errOnce.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), first
}

// bareReceiveDelete drains total messages from q with loops concurrent
// ReceiveMessage(10) + DeleteMessageBatch loops and returns the time until
// the last delete returned. The receives are short polls (the queue is full
// until the end), so no long poll is left waiting on the server afterwards,
// where it would swallow messages sent later.
func bareReceiveDelete(ctx context.Context, c *sqs.Client, q string, total, loops int) (time.Duration, error) {
	var got atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var first error
	var mu sync.Mutex
	var last time.Time
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	start := time.Now()
	for range loops {
		wg.Go(func() {
			for got.Load() < int64(total) && ctx.Err() == nil {
				out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q),
					MaxNumberOfMessages: 10, WaitTimeSeconds: 0, MessageAttributeNames: []string{"All"},
					MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount}})
				if err == nil && len(out.Messages) > 0 {
					del := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
					for i, m := range out.Messages {
						del[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
					}
					var dout *sqs.DeleteMessageBatchOutput
					dout, err = c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q), Entries: del})
					if err == nil {
						now := time.Now()
						// A delete SQS refused leaves its message to come back:
						// not drained, so not counted.
						got.Add(int64(len(out.Messages) - len(dout.Failed)))
						mu.Lock()
						if now.After(last) {
							last = now
						}
						mu.Unlock()
					}
				}
				if err != nil && ctx.Err() == nil {
					errOnce.Do(func() { first = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil && got.Load() < int64(total) {
		first = fmt.Errorf("received %d of %d messages: %w", got.Load(), total, ctx.Err())
	}
	return last.Sub(start), first
}

func depth(ctx context.Context, c *sqs.Client, q string) (int, error) {
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q), AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		return 0, err
	}
	v, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	i, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return v + i, nil
}

// waitUntil polls cond every interval until it is true, fails or timeout passes.
func waitUntil(ctx context.Context, timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not done after %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

func count(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// series collects one SQS measurement's rounds.
type series struct {
	key, name, unit, base string
	target                *Target
	rates                 []float64
	n                     int
	elapsed               time.Duration
	cpu                   cpuUse
	details               map[string]any
}

func (s *series) add(n int, el time.Duration, use cpuUse) {
	s.cpu = s.cpu.add(use, s.elapsed, el)
	s.rates = append(s.rates, float64(n)/el.Seconds())
	s.n += n
	s.elapsed += el
}

func (s *series) row(rep *report, sec string) {
	rates := slices.Clone(s.rates)
	slices.Sort(rates)
	d := map[string]any{"messages": s.n, "measured_s": s.elapsed.Seconds(), "round_rates": s.rates,
		"mean_rate": float64(s.n) / s.elapsed.Seconds(), "cpu_cores": s.cpu.rounded()}
	for k, v := range s.details {
		d[k] = v
	}
	row := &Row{Key: s.key, Section: sec, Name: s.name, Value: median(rates), Unit: s.unit, Rounds: s.rates, Target: s.target, Details: d}
	if s.base != "" {
		row.Baseline = rep.ref(s.base)
	}
	rep.add(row)
}

// warmupMsgs is the size of the SQS measurements' unrecorded warm-up round.
const warmupMsgs = 2000

// relayCase is one relay configuration, with its own database and queue.
type relayCase struct {
	series
	replicas, workers, calls int
	deleteOnPublish          bool
	pool                     *pgxpool.Pool
	queue                    string
	publishShare             []float64 // per round
	warmup                   int       // rows sent in the warm-up round
}

func benchSQS(ctx context.Context, pg *pgEnv, sq *sqsEnv, o options, rep *report) error {
	const sec = "SQS: baselines, the relay and the inbox receiver"
	rounds := max(1, o.sqsRounds)
	per := max(100, o.relayRows/rounds)
	c := sq.client
	progress("sqs: %d messages per measurement in %d interleaved rounds of %d", per*rounds, rounds, per)
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()

	// Bare SendMessageBatch, with as many calls in flight as one relay
	// replica can have (2 workers x 4) and with one PublishBatch's worth
	// (4), interleaved with the relay's configurations: m pre-inserted
	// outbox rows until all are marked published.
	sendQ, del, err := sq.queue(ctx, "send", 30*time.Second)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, del)
	bare8 := &series{key: "bare_send", name: fmt.Sprintf("bare SendMessageBatch (10/call, %d in flight)", relayInFlight), unit: "msgs/s"}
	bare4 := &series{key: "bare_send_f4", name: fmt.Sprintf("bare SendMessageBatch (10/call, %d in flight)", publisherCalls), unit: "msgs/s"}
	relays := []*relayCase{
		{series: series{key: "relay_r1", name: fmt.Sprintf("outbox relay, 1 replica, defaults (%d workers, %d calls in flight)", relayWorkers, relayInFlight),
			unit: "rows/s", base: "bare_send", target: minRatio(0.8)}, replicas: 1, workers: relayWorkers, calls: relayInFlight},
		{series: series{key: "relay_r2", name: fmt.Sprintf("outbox relay, 2 replicas, defaults (%d workers, %d calls in flight, each)", relayWorkers, relayInFlight),
			unit: "rows/s", base: "bare_send"}, replicas: 2, workers: relayWorkers, calls: relayInFlight},
		{series: series{key: "relay_r1_w4", name: fmt.Sprintf("outbox relay, 1 replica, tuned: 4 workers (still %d calls in flight)", relayInFlight),
			unit: "rows/s", base: "bare_send"}, replicas: 1, workers: 4, calls: relayInFlight},
		{series: series{key: "relay_r1_delete", name: fmt.Sprintf("outbox relay, 1 replica, DeleteOnPublish (%d workers, %d calls in flight)", relayWorkers, relayInFlight),
			unit: "rows/s", base: "bare_send"}, replicas: 1, workers: relayWorkers, calls: relayInFlight, deleteOnPublish: true},
	}
	wm := &series{key: "peer_watermill", name: "Watermill v1.5.1 Forwarder (watermill-sql v4.1.2 outbox → SQS)", unit: "rows/s"}
	for _, rc := range relays {
		pool, drop, err := pg.freshDB(ctx, rc.key, 4)
		if err != nil {
			return err
		}
		cleanups = append(cleanups, drop)
		if err := outbox.Migrate(ctx, pool); err != nil {
			return err
		}
		q, del, err := sq.queue(ctx, strings.ReplaceAll(rc.key, "_", "-"), 30*time.Second)
		if err != nil {
			return err
		}
		cleanups = append(cleanups, del)
		rc.pool, rc.queue = pool, q
	}
	// Round 0 is a warm-up, not recorded: the SQS server's first calls
	// (connections, its JIT) and each side's first batch are slower, and
	// whichever ran first in the first round would pay for them.
	for round := range rounds + 1 {
		n := per
		if round == 0 {
			n = min(per, warmupMsgs)
		}
		for _, b := range []struct {
			s        *series
			inFlight int
		}{{bare8, relayInFlight}, {bare4, publisherCalls}} {
			msgs, err := relayMessages(n)
			if err != nil {
				return err
			}
			var el time.Duration
			use, err := cpuOf(func() (err error) {
				measuring(ctx, b.s.key, func(ctx context.Context) { el, err = bareSend(ctx, c, sendQ, msgs, b.inFlight) })
				return err
			})
			if err != nil {
				return fmt.Errorf("bare send: %w", err)
			}
			if round > 0 {
				b.s.add(n, el, use)
			}
		}
		for _, rc := range relays {
			var el time.Duration
			var use cpuUse
			var share float64
			measuring(ctx, rc.key, func(ctx context.Context) { el, use, share, err = relayRound(ctx, sq, rc, n) })
			if err != nil {
				return fmt.Errorf("%s: %w", rc.name, err)
			}
			if round == 0 {
				rc.warmup = n
			} else {
				rc.add(n, el, use)
				rc.publishShare = append(rc.publishShare, share)
			}
		}
		if peerCmd != nil {
			var res peerResult
			use, err := cpuOf(func() (err error) { res, err = peerCmd.round(ctx, "watermill", n, 0); return err })
			if err != nil {
				return err
			}
			if round > 0 {
				wm.add(n, time.Duration(res.Seconds*float64(time.Second)), use)
				wm.details = map[string]any{"config": res.Config}
			}
		}
	}
	if peerCmd != nil {
		wm.row(rep, sec)
	}
	bare8.row(rep, sec)
	bare4.row(rep, sec)
	for _, rc := range relays {
		d, err := depth(ctx, c, rc.queue)
		if err != nil {
			return err
		}
		rc.details = map[string]any{"replicas": rc.replicas, "workers": rc.workers, "calls_in_flight": rc.calls,
			"queue_depth_after": d, "duplicates_sent": d - rc.n - rc.warmup, "publish_share_per_round": rc.publishShare}
		rc.row(rep, sec)
	}
	if r1, w := rep.ref("relay_r1"), rep.ref("peer_watermill"); r1 != nil && w != nil {
		rep.add(&Row{Key: "relay_r1_vs_watermill", Section: sec, Name: "outbox relay, 1 replica, vs Watermill's Forwarder", Value: r1.Value, Unit: "rows/s",
			Rounds: r1.Rounds, Baseline: w, Target: minRatio(1.5)})
	}
	if r1, r2 := rep.ref("relay_r1"), rep.ref("relay_r2"); r1 != nil && r2 != nil {
		rep.add(&Row{Key: "relay_r2_vs_r1", Section: sec, Name: "outbox relay, 2 replicas vs 1", Value: r2.Value, Unit: "rows/s", Rounds: r2.Rounds,
			Baseline: r1, Target: minRatio(1)})
	}
	var el time.Duration
	use, err := cpuOf(func() (err error) { el, err = bareReceiveDelete(ctx, c, sendQ, 2*per*rounds, 4); return err })
	if err != nil {
		return fmt.Errorf("bare receive+delete: %w", err)
	}
	rep.add(&Row{Key: "bare_recv4", Section: sec, Name: "bare Receive(10)+DeleteBatch, 4 loops",
		Value: float64(2*per*rounds) / el.Seconds(), Unit: "msgs/s",
		Details: map[string]any{"messages": 2 * per * rounds, "elapsed_s": el.Seconds(), "cpu_cores": use.rounded()}})

	// One receive loop, which is what a Subscriber runs, interleaved with
	// the Subscriber feeding an Inbox (inboxsqs) over as many messages.
	recvQ, del, err := sq.queue(ctx, "recv1", 30*time.Second)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, del)
	pool, drop, err := pg.freshDB(ctx, "inboxsqs", 12)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, drop)
	if err := idempotent.Migrate(ctx, pool); err != nil {
		return err
	}
	in, err := idempotent.NewInbox(pool, consumerName, idempotent.InboxConfig{Logger: quiet, MeterProvider: noop.NewMeterProvider()})
	if err != nil {
		return err
	}
	defer in.Close()
	recv1 := &series{key: "bare_recv1", name: "bare Receive(10)+DeleteBatch, 1 loop", unit: "msgs/s"}
	inbox := &series{key: "inboxsqs", name: "Subscriber(8)+inboxsqs: received, stored, deleted", unit: "acks/s", base: "bare_recv1"}
	cc, calls := sqscount.Client(c)
	for r := range rounds {
		msgs, err := relayMessages(per)
		if err != nil {
			return err
		}
		if _, err := bareSend(ctx, c, recvQ, msgs, relayInFlight); err != nil {
			return err
		}
		use, err := cpuOf(func() (err error) { el, err = bareReceiveDelete(ctx, c, recvQ, per, 1); return err })
		if err != nil {
			return fmt.Errorf("bare receive+delete: %w", err)
		}
		recv1.add(per, el, use)

		// A queue per round: a stopped Subscriber's last long poll may
		// still be waiting on the server and would take the next round's
		// first messages out of sight for a visibility timeout.
		inQ, del, err := sq.queue(ctx, fmt.Sprintf("inboxsqs-%d", r), 30*time.Second)
		if err != nil {
			return err
		}
		cleanups = append(cleanups, del)
		if msgs, err = relayMessages(per); err != nil {
			return err
		}
		if _, err := bareSend(ctx, c, inQ, msgs, relayInFlight); err != nil {
			return err
		}
		sub, err := sqstransport.NewSubscriber(cc, sqstransport.SubscriberConfig{QueueURL: inQ, WaitTime: time.Second, Logger: quiet},
			inboxsqs.Handler(in, idempotent.ByAggregate))
		if err != nil {
			return err
		}
		sctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		s0 := cpu.sample()
		start := time.Now()
		go func() { done <- sub.Run(sctx) }()
		want := int64(per * (r + 1))
		err = waitUntil(ctx, 5*time.Minute, 10*time.Millisecond, "inbox stores every message", func() (bool, error) {
			n, err := count(ctx, pool, `SELECT count(*) FROM inbox`)
			return n >= want, err
		})
		if err == nil {
			err = waitUntil(ctx, time.Minute, 10*time.Millisecond, "queue drained", func() (bool, error) {
				d, err := depth(ctx, c, inQ)
				return d == 0, err
			})
		}
		el = time.Since(start)
		use = s0.until(cpu.sample())
		stop()
		if rerr := <-done; err == nil {
			err = rerr
		}
		if err != nil {
			return fmt.Errorf("subscriber+inbox: %w", err)
		}
		inbox.add(per, el, use)
	}
	recv1.row(rep, sec)
	inbox.details = map[string]any{"subscriber_concurrency": 8,
		"msgs_per_receive": float64(inbox.n) / float64(max(calls("ReceiveMessage"), 1)),
		"msgs_per_delete":  float64(inbox.n) / float64(max(calls("DeleteMessageBatch"), 1))}
	inbox.row(rep, sec)

	// Latency from commit to the queue.
	return benchLatency(ctx, pg, sq, o, rep)
}

// measuring runs f with the pprof label measurement=key, which the
// goroutines it starts inherit, so that -cpuprofile's samples of each
// measurement can be told apart (go tool pprof -tagfocus measurement=key).
func measuring(ctx context.Context, key string, f func(context.Context)) {
	pprof.Do(ctx, pprof.Labels("measurement", key), f)
}

// relayRound COPYs per rows into rc's outbox and times its relays from
// start until every row is marked published; share is the part of the
// workers' time spent in PublishBatch (the rest is claiming, marking and
// waiting for a wake-up).
func relayRound(ctx context.Context, sq *sqsEnv, rc *relayCase, per int) (el time.Duration, use cpuUse, share float64, err error) {
	if err := copyOutbox(ctx, rc.pool, per); err != nil {
		return 0, nil, 0, err
	}
	pools := make([]*pgxpool.Pool, rc.replicas)
	for i := range pools {
		cfg := rc.pool.Config().Copy()
		cfg.MaxConns = int32(rc.workers + 2)
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return 0, nil, 0, err
		}
		defer p.Close()
		if err := p.Ping(ctx); err != nil {
			return 0, nil, 0, err
		}
		pools[i] = p
	}
	// One publisher per replica, as one per process: its in-flight limit is
	// the replica's. They share one busy counter.
	relays := make([]*outbox.Relay, rc.replicas)
	busy := new(atomic.Int64)
	for i := range relays {
		pub := &busyPublisher{next: sqstransport.NewPublisher(sq.client, rc.queue, rc.calls), busy: busy}
		r, err := outbox.NewRelay(pools[i], pub,
			outbox.RelayConfig{Workers: rc.workers, DeleteOnPublish: rc.deleteOnPublish, Logger: quiet})
		if err != nil {
			return 0, nil, 0, err
		}
		relays[i] = r
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	s0 := cpu.sample()
	start := time.Now()
	for _, r := range relays {
		wg.Go(func() { _ = r.Run(rctx) })
	}
	// EXISTS, not count(*): a count of the rows left, 200 times a second,
	// costs PostgreSQL a heap visit per waiting row and charges the relay
	// with the bench's own load.
	err = waitUntil(ctx, 5*time.Minute, 5*time.Millisecond, "every outbox row published", func() (bool, error) {
		n, err := count(ctx, rc.pool, `SELECT count(*) FROM (SELECT 1 FROM outbox WHERE published_at IS NULL LIMIT 1) s`)
		return n == 0, err
	})
	el = time.Since(start)
	use = s0.until(cpu.sample())
	stop()
	wg.Wait()
	return el, use, float64(busy.Load()) / float64(el) / float64(rc.replicas*rc.workers), err
}

// busyPublisher adds up the time spent in PublishBatch.
type busyPublisher struct {
	next outbox.Publisher
	busy *atomic.Int64 // nanoseconds
}

func (p *busyPublisher) PublishBatch(ctx context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	t := time.Now()
	defer func() { p.busy.Add(int64(time.Since(t))) }()
	return p.next.PublishBatch(ctx, msgs)
}

// copyOutbox COPYs m outbox rows shaped like Add's: valid envelopes with
// UUIDv7 ids and a traceparent header.
func copyOutbox(ctx context.Context, pool *pgxpool.Pool, m int) error {
	src := make([][]any, m)
	headers := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	for i := range src {
		cr, err := newCredit()
		if err != nil {
			return err
		}
		e := cr.env
		src[i] = []any{e.EventID, e.AggregateID, e.AggregateVersion, e.EventType, string(e.Payload), headers, e.OccurredAt}
	}
	_, err := pool.CopyFrom(ctx, pgx.Identifier{"outbox"},
		[]string{"id", "aggregate_id", "aggregate_version", "event_type", "payload", "headers", "occurred_at"}, pgx.CopyFromRows(src))
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `ANALYZE outbox`)
	return err
}

// timingPublisher notes when the queue accepted each message.
type timingPublisher struct {
	next outbox.Publisher
	mu   sync.Mutex
	at   map[uuid.UUID]time.Time
}

func (p *timingPublisher) PublishBatch(ctx context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	failed, err := p.next.PublishBatch(ctx, msgs)
	now := time.Now()
	if err != nil {
		return failed, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if _, bad := failed[m.EventID]; !bad {
			if _, seen := p.at[m.EventID]; !seen {
				p.at[m.EventID] = now
			}
		}
	}
	return failed, nil
}

// receivers long-poll q, noting when each event id was first seen, and
// delete what they receive; stop ends them.
func receivers(ctx context.Context, c *sqs.Client, q string, n int) (seen func() map[uuid.UUID]time.Time, stop func()) {
	var mu sync.Mutex
	at := map[uuid.UUID]time.Time{}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), MaxNumberOfMessages: 10,
					WaitTimeSeconds: 1, VisibilityTimeout: 5})
				if err != nil {
					continue
				}
				now := time.Now()
				mu.Lock()
				for _, m := range out.Messages {
					var env struct {
						EventID uuid.UUID `json:"event_id"`
					}
					if json.Unmarshal([]byte(aws.ToString(m.Body)), &env) == nil {
						if _, ok := at[env.EventID]; !ok {
							at[env.EventID] = now
						}
					}
				}
				mu.Unlock()
				if len(out.Messages) > 0 {
					del := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
					for i, m := range out.Messages {
						del[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
					}
					_, _ = c.DeleteMessageBatch(context.WithoutCancel(ctx), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q), Entries: del})
				}
			}
		})
	}
	return func() map[uuid.UUID]time.Time {
			mu.Lock()
			defer mu.Unlock()
			cp := make(map[uuid.UUID]time.Time, len(at))
			for k, v := range at {
				cp[k] = v
			}
			return cp
		}, func() {
			cancel()
			wg.Wait()
		}
}

// latencyRate is the steady rate at which the latency measurements commit
// (or send) events, one at a time.
const latencyRate = 100

// steady calls send latencyRate times a second for d, one at a time, and
// returns when each call was made (t0 per id).
func steady(ctx context.Context, d time.Duration, send func(ctx context.Context) (uuid.UUID, time.Time, error)) (map[uuid.UUID]time.Time, error) {
	t0 := map[uuid.UUID]time.Time{}
	n := int(d.Seconds() * latencyRate)
	begin := time.Now()
	for i := range n {
		if w := time.Until(begin.Add(time.Duration(i) * time.Second / latencyRate)); w > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(w):
			}
		}
		id, at, err := send(ctx)
		if err != nil {
			return nil, err
		}
		t0[id] = at
	}
	return t0, nil
}

func latencies(t0, t1 map[uuid.UUID]time.Time) []float64 {
	ds := make([]time.Duration, 0, len(t0))
	for id, a := range t0 {
		if b, ok := t1[id]; ok {
			ds = append(ds, b.Sub(a))
		}
	}
	return sortedMillis(ds)
}

func waitSeen(ctx context.Context, seen func() map[uuid.UUID]time.Time, want map[uuid.UUID]time.Time) error {
	return waitUntil(ctx, 60*time.Second, 10*time.Millisecond, "every event received", func() (bool, error) {
		s := seen()
		for id := range want {
			if _, ok := s[id]; !ok {
				return false, nil
			}
		}
		return true, nil
	})
}

func benchLatency(ctx context.Context, pg *pgEnv, sq *sqsEnv, o options, rep *report) error {
	const sec = "Latency: outbox commit → queue"
	c := sq.client
	progress("latency, %d events/s for %s each", latencyRate, o.duration)

	// Baseline: SendMessage at t0, received at t1.
	var bareP50 float64
	if err := func() error {
		q, del, err := sq.queue(ctx, "lat-bare", 30*time.Second)
		if err != nil {
			return err
		}
		defer del()
		seen, stop := receivers(ctx, c, q, 2)
		defer stop()
		t0, err := steady(ctx, o.duration, func(ctx context.Context) (uuid.UUID, time.Time, error) {
			cr, err := newCredit()
			if err != nil {
				return uuid.Nil, time.Time{}, err
			}
			body, _ := cr.env.Marshal()
			at := time.Now()
			_, err = c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(q), MessageBody: aws.String(string(body))})
			return cr.env.EventID, at, err
		})
		if err != nil {
			return err
		}
		if err := waitSeen(ctx, seen, t0); err != nil {
			return err
		}
		lat := latencies(t0, seen())
		bareP50 = percentile(lat, 0.5)
		rep.add(&Row{Key: "bare_send_recv_p50", Section: sec, Name: "bare SendMessage → ReceiveMessage, p50", Value: bareP50, Unit: "ms",
			Details: map[string]any{"p99_ms": percentile(lat, 0.99), "events": len(lat)}})
		return nil
	}(); err != nil {
		return fmt.Errorf("bare latency: %w", err)
	}

	for _, tc := range []struct {
		key, name string
		cfg       outbox.RelayConfig
	}{
		{"listen", "LISTEN + Notifier after commit (poll 10s)", outbox.RelayConfig{PollInterval: 10 * time.Second}},
		{"poll200", "polling every 200ms", outbox.RelayConfig{PollInterval: 200 * time.Millisecond, DisableListen: true}},
	} {
		if err := func() error {
			pool, drop, err := pg.freshDB(ctx, "lat_"+tc.key, 6)
			if err != nil {
				return err
			}
			defer drop()
			if err := outbox.Migrate(ctx, pool); err != nil {
				return err
			}
			q, del, err := sq.queue(ctx, "lat-"+tc.key, 30*time.Second)
			if err != nil {
				return err
			}
			defer del()
			tp := &timingPublisher{next: sqstransport.NewPublisher(c, q, relayInFlight), at: map[uuid.UUID]time.Time{}}
			cfg := tc.cfg
			cfg.Logger = quiet
			relay, err := outbox.NewRelay(pool, tp, cfg)
			if err != nil {
				return err
			}
			rctx, stopRelay := context.WithCancel(ctx)
			relayDone := make(chan struct{})
			go func() { defer close(relayDone); _ = relay.Run(rctx) }()
			defer func() { stopRelay(); <-relayDone }()
			if !cfg.DisableListen {
				if err := waitUntil(ctx, 10*time.Second, 10*time.Millisecond, "relay LISTENing", func() (bool, error) {
					n, err := count(ctx, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN outbox'`)
					return n > 0, err
				}); err != nil {
					return err
				}
			}
			seen, stop := receivers(ctx, c, q, 2)
			defer stop()
			var wake *outbox.Notifier
			if !cfg.DisableListen {
				n, stopWake, err := startNotifier(ctx, pool)
				if err != nil {
					return err
				}
				defer stopWake()
				wake = n
			}
			t0, err := steady(ctx, o.duration, func(ctx context.Context) (uuid.UUID, time.Time, error) {
				cr, err := newCredit()
				if err != nil {
					return uuid.Nil, time.Time{}, err
				}
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, cr.env) })
				at := time.Now()
				wake.Notify()
				return cr.env.EventID, at, err
			})
			if err != nil {
				return err
			}
			if err := waitSeen(ctx, seen, t0); err != nil {
				return err
			}
			tp.mu.Lock()
			accepted := latencies(t0, tp.at)
			tp.mu.Unlock()
			received := latencies(t0, seen())
			row := &Row{Key: "outbox_queue_" + tc.key + "_p50", Section: sec,
				Name:  "outbox commit → SQS accepted, " + tc.name + ", p50",
				Value: percentile(accepted, 0.5), Unit: "ms",
				Details: map[string]any{"p99_ms": percentile(accepted, 0.99), "events": len(accepted),
					"commit_to_received_p50_ms": percentile(received, 0.5), "commit_to_received_p99_ms": percentile(received, 0.99),
					"added_vs_bare_send_received_p50_ms": percentile(received, 0.5) - bareP50}}
			if tc.key == "listen" {
				row.Target = maxValue(10, "ms")
			}
			rep.add(row)
			rep.add(&Row{Key: "outbox_queue_" + tc.key + "_p99", Section: sec,
				Name:  "outbox commit → SQS accepted, " + tc.name + ", p99",
				Value: percentile(accepted, 0.99), Unit: "ms"})
			rep.add(&Row{Key: "outbox_added_" + tc.key + "_p50", Section: sec,
				Name:  "added vs a direct send: (commit → received) − (send → received), " + tc.name + ", p50",
				Value: percentile(received, 0.5) - bareP50, Unit: "ms",
				Details: map[string]any{"commit_to_received_p50_ms": percentile(received, 0.5), "commit_to_received_p99_ms": percentile(received, 0.99)}})
			return nil
		}(); err != nil {
			return fmt.Errorf("latency %s: %w", tc.key, err)
		}
	}
	return nil
}
