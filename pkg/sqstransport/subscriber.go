package sqstransport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/failpoint"
	"github.com/effectively-once/payments-cashback/pkg/outage"
	"github.com/effectively-once/payments-cashback/pkg/retry"
	"github.com/effectively-once/payments-cashback/pkg/worker"
)

// Delivery is one received copy of an event.
type Delivery struct {
	Envelope     events.Envelope
	SQSMessageID string // the SQS MessageId: changes on redrive, never a dedupe key
	ReceiveCount int    // ApproximateReceiveCount
	Attributes   map[string]string
	Body         []byte
	// Ctx is, for a BatchHandler, this message's own context: its trace
	// span, under the traceparent it arrived with. A Handler gets that
	// context as its ctx argument and Ctx is nil.
	Ctx context.Context

	received time.Time // when the subscriber decoded it, just after the receive
}

// Handler processes one delivery. Return nil only once the effect is
// committed (or known to be committed before); the message is then deleted.
type Handler func(ctx context.Context, d Delivery) error

// Permanent marks err as one that no redelivery can fix: the Subscriber
// parks the message in the DLQ instead of retrying it. It is
// errs.Permanent: one marker for the whole library.
func Permanent(err error) error { return errs.Permanent(err) }

// IsPermanent reports whether err, or an error it wraps, has a Permanent()
// method that returns true.
func IsPermanent(err error) bool { return errs.IsPermanent(err) }

// SubscriberConfig tunes a Subscriber. Zero values take the defaults in brackets.
type SubscriberConfig struct {
	QueueURL string
	// DLQURL is where undecodable and permanently failing messages are
	// parked. Empty: found from the queue's RedrivePolicy at start.
	DLQURL string
	// Concurrency is how many handlers run at once [8]; for a
	// NewBatchSubscriber, how many receives (batches) are handled at once.
	Concurrency int
	// WaitTime is the long-poll wait [20s, within 1s..20s]; MaxMessages per
	// receive [10].
	WaitTime    time.Duration
	MaxMessages int
	// Visibility is the visibility timeout the subscriber keeps renewing
	// while a handler runs [30s, at least 1s]. MaxExtension caps the renewals [15m], so a
	// hung handler eventually lets another replica try. HandlerTimeout
	// stops handlers that honour their context first; the renewals cover
	// one that ignores it.
	Visibility, MaxExtension time.Duration
	// HandlerTimeout is each handler's deadline [Visibility*4/5]; it must be
	// less than Visibility. A handler past it has its context cancelled,
	// which rolls back its transaction and releases the dedupe key it holds
	// locked; the message is left for redelivery and the timeout counted
	// (sqs_handler_timeouts_total). Without it a hung effect keeps its key
	// locked and every later copy of the event waits behind it, each holding
	// a pool connection, until the pool is empty and the consumer stops.
	HandlerTimeout time.Duration
	// RetryBase and RetryMax space out redeliveries after a handler error:
	// the message becomes visible again after min(RetryMax,
	// RetryBase*2^(receives-1)) [retry.BaseDefault, 1m], the retry
	// package's schedule without jitter (SQS spreads redeliveries itself:
	// each message's visibility runs from its own receive). SQS counts the
	// delay in whole seconds: a fraction is dropped (a base below 1s makes
	// the first redelivery immediate); and it keeps a message in flight 12
	// hours from its receive at most, so a longer delay ends a minute
	// before that.
	RetryBase, RetryMax time.Duration
	// ShutdownGrace bounds how long in-flight handlers may run after the
	// context is cancelled [30s].
	ShutdownGrace time.Duration
	// MaxPanics: a handler panic fails its message like an error, and a
	// message whose handler panics on its MaxPanics-th receive or later is
	// parked with reason "panic" [3]. A handler error that is or wraps a
	// recovered panic (errs.IsPanic: idempotent.Consumer returns one for a
	// panicking Effect) counts as the handler's panic. Keep it below the queue's
	// maxReceiveCount, or SQS's redrive parks it first, with no reason.
	MaxPanics int
	// Gate, when set, tells an outage of the handler's dependency (its
	// database unreachable) from a failing message: while it is closed the
	// subscriber receives nothing, and a message whose handler failed
	// because of the outage is held (its visibility kept extended, for up
	// to MaxExtension) and handled again once the gate reopens, so an
	// outage costs no receives towards maxReceiveCount. Nil: every handler
	// error is the message's own.
	Gate   *outage.Gate
	Logger *slog.Logger
}

// SQS's limits, and the defaults that depend on nothing else.
const (
	maxMessages       = 10
	maxWaitTime       = 20 * time.Second
	maxVisibility     = 12 * time.Hour
	visibilityDefault = 30 * time.Second
	retryMaxDefault   = time.Minute
)

func (c *SubscriberConfig) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.MaxMessages <= 0 || c.MaxMessages > maxMessages {
		c.MaxMessages = maxMessages
	}
	def(&c.WaitTime, maxWaitTime)
	def(&c.Visibility, visibilityDefault)
	// SQS counts both in whole seconds. A long-poll wait over 20 s is
	// rejected (every receive would fail), and one under a second rounds
	// to 0, a busy short poll. A visibility under a second rounds to 0:
	// every message would be visible again as soon as it is received.
	c.WaitTime = min(max(c.WaitTime, time.Second), maxWaitTime)
	c.Visibility = min(max(c.Visibility, time.Second), maxVisibility)
	def(&c.HandlerTimeout, c.Visibility*4/5)
	def(&c.MaxExtension, 15*time.Minute)
	def(&c.RetryBase, retry.BaseDefault)
	def(&c.RetryMax, retryMaxDefault)
	def(&c.ShutdownGrace, 30*time.Second)
	if c.MaxPanics <= 0 {
		c.MaxPanics = 3
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Subscriber consumes one queue. See the package documentation for its
// delivery contract.
type Subscriber struct {
	client   *sqs.Client
	cfg      SubscriberConfig
	handler  Handler
	batch    BatchHandler // set by NewBatchSubscriber; then handler is nil
	log      *slog.Logger
	deletes  chan string
	stopping context.Context // Run's ctx: cancelled when the drain starts
	// callTimeout bounds each call to SQS (see callTimeout); a receive
	// gets WaitTime more.
	callTimeout time.Duration

	received, deleted, parked, failed, timeouts metric.Int64Counter
	duration                                    metric.Float64Histogram
	attrQueue                                   attribute.KeyValue
}

// NewSubscriber returns a Subscriber that calls handler for each message.
func NewSubscriber(client *sqs.Client, cfg SubscriberConfig, handler Handler) (*Subscriber, error) {
	if handler == nil {
		return nil, errors.New("sqstransport: NewSubscriber needs a handler")
	}
	return newSubscriber(client, cfg, handler)
}

func newSubscriber(client *sqs.Client, cfg SubscriberConfig, handler Handler) (*Subscriber, error) {
	if client == nil {
		return nil, errors.New("sqstransport: a subscriber needs an SQS client")
	}
	if cfg.QueueURL == "" {
		return nil, errors.New("sqstransport: QueueURL is empty")
	}
	cfg.defaults()
	if cfg.HandlerTimeout >= cfg.Visibility {
		return nil, fmt.Errorf("sqstransport: HandlerTimeout %v must be less than Visibility %v", cfg.HandlerTimeout, cfg.Visibility)
	}
	s := &Subscriber{client: client, cfg: cfg, handler: handler, log: cfg.Logger.With("queue", queueName(cfg.QueueURL)),
		attrQueue: attribute.String("queue", queueName(cfg.QueueURL)), callTimeout: callTimeout}
	m := otel.Meter(otelScope)
	var err error
	for _, c := range []struct {
		dst        *metric.Int64Counter
		name, desc string
	}{
		{&s.received, "sqs_messages_received_total", "Messages received."},
		{&s.deleted, "sqs_messages_deleted_total", "Messages deleted after their handler committed."},
		{&s.parked, "sqs_messages_parked_total", "Poison messages parked in the DLQ, by reason; alert when it rises."},
		{&s.failed, "sqs_handler_errors_total", "Handler errors; the message is left for redelivery."},
		{&s.timeouts, "sqs_handler_timeouts_total", "Handlers cut at HandlerTimeout and rolled back; the message is left for redelivery."},
	} {
		if *c.dst, err = m.Int64Counter(c.name, metric.WithDescription(c.desc)); err != nil {
			return nil, err
		}
	}
	if s.duration, err = m.Float64Histogram("sqs_handler_duration_seconds", metric.WithUnit("s"),
		metric.WithDescription("Time the handler took per message (its transaction included), by result (ok, refused, failed)."),
		metric.WithExplicitBucketBoundaries(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)); err != nil {
		return nil, err
	}
	return s, nil
}

func queueName(url string) string { return url[strings.LastIndex(url, "/")+1:] }

// Run consumes until ctx is cancelled, then drains: no new receives,
// in-flight handlers finish within ShutdownGrace and their messages are
// deleted. A handler still running when the grace ends has its context
// cancelled; if it returns nil all the same (its commit won the race), its
// message is still deleted. It returns nil after a clean drain.
func (s *Subscriber) Run(ctx context.Context) error {
	if s.cfg.DLQURL == "" {
		dlq, err := s.discoverDLQ(ctx)
		if err != nil {
			return err
		}
		s.cfg.DLQURL = dlq
		if dlq == "" {
			s.log.Warn("queue has no RedrivePolicy: poison messages cannot be parked and will stay in the queue")
		}
	}
	// Handlers outlive ctx by up to ShutdownGrace; they get a context that
	// is cancelled only when the grace runs out.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	s.deletes = make(chan string, 4*s.cfg.Concurrency)
	deleterDone := make(chan struct{})
	// The deleter is not on work: a handler that commits as the grace runs
	// out settles after stopWork, and its delete must still be sent, or the
	// message comes back once more. Each call has its own deadline instead.
	go func() { defer close(deleterDone); s.deleter(context.WithoutCancel(ctx)) }()

	s.stopping = ctx
	slots := worker.NewSlots(s.cfg.Concurrency)
	var inflight sync.WaitGroup
	receiveFailures := 0
	for ctx.Err() == nil {
		// During an outage nothing is received: each receive would cost a
		// message one of its maxReceiveCount deliveries for nothing. The
		// gate is asked before waiting for a slot and again after.
		if s.cfg.Gate.Wait(ctx) != nil {
			continue
		}
		// Take at least one free slot before receiving, so messages never sit
		// in memory waiting for a handler while their visibility runs out.
		// In batch mode a slot is a whole receive, which always asks for
		// MaxMessages; otherwise a slot is a message.
		most := s.cfg.MaxMessages
		if s.batch != nil {
			most = 1
		}
		n := slots.Take(ctx, most)
		if n == 0 {
			continue
		}
		// The gate may have closed while Take waited (a busy slot is what
		// a failing handler holds): look again, or this receive would be
		// spent on the outage.
		if s.cfg.Gate.Closed() {
			slots.Release(n)
			continue
		}
		receiveFrom := n
		if s.batch != nil {
			receiveFrom = s.cfg.MaxMessages
		}
		// The long poll is not cancelled on shutdown: SQS keeps serving an
		// abandoned poll, and whatever it hands out then stays invisible for
		// a whole visibility timeout (and counts towards maxReceiveCount).
		// So shutdown waits for the current poll (at most WaitTime, plus
		// callTimeout for an answer that never comes: receive's deadline)
		// and processes what it brings.
		msgs, err := s.receive(context.WithoutCancel(ctx), receiveFrom)
		if err == nil {
			receiveFailures = 0
		}
		if err != nil || len(msgs) == 0 {
			slots.Release(n)
			if err != nil && ctx.Err() == nil {
				// Backoff, so an unreachable SQS is not flooded (the SDK has
				// already retried this call): 1 s, 2 s, ... up to 20 s.
				receiveFailures++
				delay := receiveRetry.Delay(receiveFailures)
				s.log.Error("receive failed", "error", err, "retry_in", delay)
				sleep(ctx, delay)
			}
			continue
		}
		if s.batch != nil {
			inflight.Go(func() {
				defer slots.Release(1)
				s.processBatch(work, msgs)
			})
			continue
		}
		slots.Release(n - len(msgs))
		for _, m := range msgs {
			inflight.Go(func() {
				defer slots.Release(1)
				s.process(work, m)
			})
		}
	}
	drained := make(chan struct{})
	go func() { inflight.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(s.cfg.ShutdownGrace):
		s.log.Warn("shutdown grace over: cancelling in-flight handlers; their messages stay in the queue")
		stopWork()
		<-drained
	}
	close(s.deletes)
	<-deleterDone
	return nil
}

// receive long-polls for up to n messages. SQS answers a poll within
// WaitTime; the call's deadline is callTimeout past that, so a connection
// that stalls (the SDK's HTTP client has no response timeout) fails the
// receive, which backs off and is retried, instead of hanging it and, on
// shutdown, Run.
func (s *Subscriber) receive(ctx context.Context, n int) ([]types.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WaitTime+s.callTimeout)
	defer cancel()
	out, err := s.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    &s.cfg.QueueURL,
		MaxNumberOfMessages:         int32(n),
		WaitTimeSeconds:             int32(s.cfg.WaitTime / time.Second),
		VisibilityTimeout:           int32(s.cfg.Visibility / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
	})
	if err != nil {
		return nil, err
	}
	s.received.Add(ctx, int64(len(out.Messages)), metric.WithAttributes(s.attrQueue))
	return out.Messages, nil
}

// decode turns a received message into a Delivery. An undecodable one is
// parked here and ok is false.
func (s *Subscriber) decode(ctx context.Context, m types.Message) (d Delivery, log *slog.Logger, ok bool) {
	d = Delivery{SQSMessageID: aws.ToString(m.MessageId), Body: []byte(aws.ToString(m.Body)), Attributes: map[string]string{},
		received: time.Now()}
	d.ReceiveCount, _ = strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	for k, v := range m.MessageAttributes {
		if v.StringValue != nil {
			d.Attributes[k] = *v.StringValue
		}
	}
	log = s.log.With("sqs_message_id", d.SQSMessageID, "receive_count", d.ReceiveCount)
	env, err := events.Decode(d.Body)
	if err != nil {
		log.Error("undecodable message: parking it", "error", err)
		s.park(ctx, m, d, "undecodable", err)
		return d, log, false
	}
	d.Envelope = env
	return d, log.With("event_id", env.EventID, "event_type", env.EventType), true
}

// startSpan continues the message's trace (its traceparent attribute).
func (s *Subscriber) startSpan(ctx context.Context, d Delivery) (context.Context, trace.Span) {
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(d.Attributes))
	return otel.Tracer(otelScope).Start(ctx, "process "+d.Envelope.EventType,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.message.id", d.SQSMessageID), attribute.String("event_id", d.Envelope.EventID.String())))
}

func (s *Subscriber) process(ctx context.Context, m types.Message) {
	d, log, ok := s.decode(ctx, m)
	if !ok {
		return
	}
	ctx, span := s.startSpan(ctx, d)
	defer span.End()

	stopHeartbeat := s.heartbeat(ctx, []*string{m.ReceiptHandle}, log)
	t0 := time.Now()
	timedOut, err := s.handle(ctx, d, log)
	stopHeartbeat()
	s.settle(ctx, span, m, d, verdict{err: err, timedOut: timedOut}, time.Since(t0), log)
}

// verdict is what a handler's run said about one message.
type verdict struct {
	err      error
	timedOut bool // past HandlerTimeout
}

// settle acts on a handler's verdict for one message: delete it (nil),
// park it (permanent) or leave it for a redelivery after its backoff.
func (s *Subscriber) settle(ctx context.Context, span trace.Span, m types.Message, d Delivery, v verdict, took time.Duration, log *slog.Logger) {
	// A panic, recovered here or below the handler, is an errs.PanicError.
	err, timedOut, panicked := v.err, v.timedOut, errs.IsPanic(v.err)
	result := "ok"
	switch {
	case timedOut:
		result = "timeout"
	case err != nil && IsPermanent(err):
		result = "refused"
	case err != nil:
		result = "failed"
	}
	s.duration.Record(ctx, took.Seconds(), metric.WithAttributes(s.attrQueue, attribute.String("result", result)))
	switch {
	case err == nil:
		if failpoint.Hit(failpoint.AfterCommitBeforeDelete) {
			return
		}
		s.deletes <- aws.ToString(m.ReceiptHandle)
	case timedOut:
		// Whatever it says, the handler did not finish in time: its
		// transaction is rolled back, so the message must come back.
		s.timeouts.Add(ctx, 1, metric.WithAttributes(s.attrQueue))
		span.RecordError(err)
		delay := s.redelivery(d)
		log.Warn("handler passed its deadline: rolled back, message left for redelivery",
			"handler_timeout", s.cfg.HandlerTimeout, "error", err, "retry_in", delay)
		s.setVisibility(ctx, m.ReceiptHandle, delay, log)
	case panicked && d.ReceiveCount >= s.cfg.MaxPanics:
		span.RecordError(err)
		log.Error("handler panicked again: parking the message", "receive_count", d.ReceiveCount, "error", err)
		s.park(ctx, m, d, "panic", err)
	case IsPermanent(err):
		log.Error("handler refused the message permanently: parking it", "error", err)
		s.park(ctx, m, d, "refused", err)
	default:
		s.failed.Add(ctx, 1, metric.WithAttributes(s.attrQueue))
		span.RecordError(err)
		delay := s.redelivery(d)
		log.Warn("handler failed: message left for redelivery", "error", err, "retry_in", delay)
		s.setVisibility(ctx, m.ReceiptHandle, delay, log)
	}
}

// call runs the handler and turns a panic into an *errs.PanicError,
// logged with its stack: one bad message must not stop the subscriber. An
// error that is a panic recovered below the handler (errs.IsPanic) counts
// towards MaxPanics alike.
func (s *Subscriber) call(ctx context.Context, d Delivery, log *slog.Logger) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &errs.PanicError{Value: v}
			log.Error("handler panicked: the message fails like a handler error", "panic", err, "stack", string(debug.Stack()))
		}
	}()
	return s.handler(ctx, d)
}

// handle runs the handler (within HandlerTimeout, panics recovered) and,
// while its failures are an outage the Gate confirms (a deadline that ran
// out included: the probe tells a hung database from a slow message),
// holds the message (the heartbeat keeps it invisible) and runs the
// handler again once the gate reopens. It gives up, returning the last
// attempt's result, when the drain starts or MaxExtension has passed since
// the receive.
func (s *Subscriber) handle(ctx context.Context, d Delivery, log *slog.Logger) (timedOut bool, err error) {
	deadline := time.Now().Add(s.cfg.MaxExtension)
	for {
		timedOut = s.within(ctx, func(hctx context.Context) { err = s.call(hctx, d, log) }) && err != nil
		if err == nil || errs.IsPanic(err) || IsPermanent(err) || !s.cfg.Gate.Suspect(ctx, err) {
			return timedOut, err
		}
		log.Warn("dependency unavailable: holding the message until it answers", "error", err)
		if s.waitGate(ctx, deadline) != nil {
			return timedOut, err
		}
	}
}

// within runs f under HandlerTimeout and reports whether that deadline,
// not ctx's end, ran out.
func (s *Subscriber) within(ctx context.Context, f func(hctx context.Context)) (late bool) {
	hctx, cancel := context.WithTimeout(ctx, s.cfg.HandlerTimeout)
	defer cancel()
	f(hctx)
	return errors.Is(hctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
}

// waitGate waits until the gate reopens, at most until deadline (the held
// messages' last extension) and never past the subscriber's stop.
func (s *Subscriber) waitGate(ctx context.Context, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stop := context.AfterFunc(s.stopping, cancel)
	defer stop()
	return s.cfg.Gate.Wait(wctx)
}

// receiveRetry spaces the receives after failed ones, so an unreachable SQS
// is not flooded (the SDK has already retried each call): 1s, 2s, ... 20s.
var receiveRetry = retry.Policy{Base: time.Second, Max: 20 * time.Second}

// redelivery is the visibility timeout after the failed delivery d: the
// backoff of its receive count, within what SQS lets a message stay in
// flight (12 hours from its receive, its extensions included; a longer
// one is refused and the message would come back at its visibility
// timeout instead), less a minute for the clocks and the calls.
func (s *Subscriber) redelivery(d Delivery) time.Duration {
	delay := retry.Policy{Base: s.cfg.RetryBase, Max: s.cfg.RetryMax}.Delay(d.ReceiveCount)
	return max(min(delay, maxVisibility-time.Since(d.received)-time.Minute), 0)
}

// heartbeat keeps the messages invisible while their handler runs.
func (s *Subscriber) heartbeat(ctx context.Context, receipts []*string, log *slog.Logger) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(s.cfg.Visibility / 2)
		defer t.Stop()
		deadline := time.Now().Add(s.cfg.MaxExtension)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if time.Now().After(deadline) {
					log.Warn("handler exceeded MaxExtension: no longer extending visibility; another copy may run")
					return
				}
				s.extend(ctx, receipts, log)
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// setVisibility sets a message's visibility timeout to d, within
// callTimeout: a call that gets no answer is logged as failed, like one
// SQS refused, and does not hold the heartbeat's stop (and with it the
// delete of a committed message) or the settling of a failed one.
func (s *Subscriber) setVisibility(ctx context.Context, receipt *string, d time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()
	_, err := s.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: &s.cfg.QueueURL, ReceiptHandle: receipt, VisibilityTimeout: int32(d / time.Second)})
	if err != nil {
		log.Warn("change visibility failed", "error", err)
	}
}

// park moves a poison message to the DLQ with the reason attached, then
// deletes the original. The copy keeps the original's attributes as far as
// SQS's limit of 10 lets it (fitAttributeCount), beside the three park_*
// ones; those it drops are logged by name. The send has callTimeout: one
// that gets no answer fails, and the message stays in the queue, as when
// SQS refuses it. Without a DLQ the message stays where it is (SQS's own
// redrive, if any, will move it after maxReceiveCount receives).
func (s *Subscriber) park(ctx context.Context, m types.Message, d Delivery, kind string, cause error) {
	s.parked.Add(ctx, 1, metric.WithAttributes(s.attrQueue, attribute.String("reason", kind)))
	if s.cfg.DLQURL == "" {
		return
	}
	attrs := make(map[string]types.MessageAttributeValue, len(m.MessageAttributes)+3)
	for k, v := range m.MessageAttributes {
		attrs[k] = v
	}
	reason := attributeText(cause.Error(), 1000)
	attrs["park_reason"] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(kind + ": " + reason)}
	attrs["park_source_queue"] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(queueName(s.cfg.QueueURL))}
	attrs[parkSourceMessageID] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(d.SQSMessageID)}
	if dropped := fitAttributeCount(attrs); len(dropped) > 0 {
		// SQS refuses a message with more than 10 attributes: the park
		// would fail, and the queue's redrive would move the message
		// later without its reason.
		s.log.Warn("parking without some of the message's attributes: with the park attributes they pass the 10 SQS carries",
			"sqs_message_id", d.SQSMessageID, "dropped", dropped)
	}
	body := aws.ToString(m.Body)
	if body == "" {
		body = "(empty body)" // SQS refuses empty bodies; the reason says what happened
	}
	if size := len(body) + attributesSize(attrs); size > MaxMessageBytes {
		// SQS counts attributes in the 256 KiB limit: a body near it leaves
		// no room for the reason. Park the body intact; the reason is logged
		// with the message id, for the operator to correlate.
		s.log.Error("parking without attributes: body and reason exceed the SQS message size",
			"sqs_message_id", d.SQSMessageID, "park_reason", kind+": "+reason, "bytes", size)
		attrs = nil
	}
	sctx, cancel := context.WithTimeout(ctx, s.callTimeout)
	_, err := s.client.SendMessage(sctx, &sqs.SendMessageInput{QueueUrl: &s.cfg.DLQURL, MessageBody: &body, MessageAttributes: attrs})
	cancel()
	if err != nil {
		s.log.Error("parking in the DLQ failed: message left in the queue", "error", err, "sqs_message_id", d.SQSMessageID)
		return
	}
	s.deletes <- aws.ToString(m.ReceiptHandle)
}

// maxMessageAttributes is SQS's limit on the attributes of a message.
const maxMessageAttributes = 10

// parkKeeps are the attributes a parked copy keeps before any other: the
// three park adds, then those the relay sets, which the project's
// consumers and tools read (event_id and event_type name the event,
// traceparent continues its trace after a redrive).
var parkKeeps = []string{"park_reason", "park_source_queue", parkSourceMessageID, "event_id", "event_type", "traceparent"}

// fitAttributeCount drops attributes from attrs, a message being parked,
// until they are within SQS's limit, and returns the names it dropped,
// sorted. It keeps parkKeeps, then the others in the order of their names.
func fitAttributeCount(attrs map[string]types.MessageAttributeValue) (dropped []string) {
	if len(attrs) <= maxMessageAttributes {
		return nil
	}
	room := maxMessageAttributes
	var rest []string
	for k := range attrs {
		if slices.Contains(parkKeeps, k) {
			room--
		} else {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	dropped = rest[min(max(room, 0), len(rest)):]
	for _, k := range dropped {
		delete(attrs, k)
	}
	return dropped
}

// attributeText is s as an attribute value SQS accepts: at most max bytes,
// cut on a character, each character no queue is sure to carry (and each
// invalid byte) written as U+FFFD.
func attributeText(s string, max int) string {
	var b strings.Builder
	for _, r := range s {
		if !events.QueueSafe(r) {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > max {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// MaxMessageBytes is SQS's limit on a message: its body and attributes.
const MaxMessageBytes = 256 * 1024

// attributesSize is what SQS counts of message attributes: each one's name,
// data type and value.
func attributesSize(attrs map[string]types.MessageAttributeValue) int {
	n := 0
	for k, v := range attrs {
		n += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	return n
}

// callTimeout bounds each call the subscriber makes to SQS other than the
// receive, the SDK's retries included: a delete, a visibility change, a
// park. The SDK's HTTP client has no response timeout, so without it a
// stalled connection would hang the call for good: the drain's last
// deletes could hold Run, a hung heartbeat the delete of a committed
// message. A receive has WaitTime plus callTimeout.
const callTimeout = 5 * time.Second

// deleter batches deletes: up to 10 receipts per DeleteMessageBatch, sent
// as soon as 10 are queued or 5 ms after the first, so completions cost a
// fraction of a round trip each. It runs until s.deletes is closed, after
// the last handler has settled: ctx is never cancelled, each call has
// callTimeout.
func (s *Subscriber) deleter(ctx context.Context) {
	batch := make([]string, 0, 10)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		entries := make([]types.DeleteMessageBatchRequestEntry, len(batch))
		for i, r := range batch {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(r)}
		}
		dctx, cancel := context.WithTimeout(ctx, s.callTimeout)
		out, err := s.client.DeleteMessageBatch(dctx, &sqs.DeleteMessageBatchInput{QueueUrl: &s.cfg.QueueURL, Entries: entries})
		cancel()
		switch {
		case err != nil:
			s.log.Error("delete batch failed: those messages will be redelivered and deduplicated", "error", err, "count", len(batch))
		case len(out.Failed) > 0:
			s.log.Warn("some deletes failed: those messages will be redelivered and deduplicated", "failed", len(out.Failed))
			s.deleted.Add(ctx, int64(len(out.Successful)), metric.WithAttributes(s.attrQueue))
		default:
			s.deleted.Add(ctx, int64(len(out.Successful)), metric.WithAttributes(s.attrQueue))
		}
		batch = batch[:0]
	}
	var timer <-chan time.Time
	for {
		select {
		case r, ok := <-s.deletes:
			if !ok {
				flush()
				return
			}
			batch = append(batch, r)
			if len(batch) == 10 {
				flush()
				timer = nil
			} else if timer == nil {
				timer = time.After(5 * time.Millisecond)
			}
		case <-timer:
			flush()
			timer = nil
		}
	}
}

func (s *Subscriber) discoverDLQ(ctx context.Context) (string, error) {
	out, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: &s.cfg.QueueURL, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameRedrivePolicy}})
	if err != nil {
		return "", fmt.Errorf("sqstransport: read RedrivePolicy of %s: %w", s.cfg.QueueURL, err)
	}
	raw := out.Attributes[string(types.QueueAttributeNameRedrivePolicy)]
	if raw == "" {
		return "", nil
	}
	var rp struct {
		DeadLetterTargetArn string `json:"deadLetterTargetArn"`
	}
	if err := json.Unmarshal([]byte(raw), &rp); err != nil {
		return "", fmt.Errorf("sqstransport: RedrivePolicy of %s: %w", s.cfg.QueueURL, err)
	}
	name := rp.DeadLetterTargetArn[strings.LastIndex(rp.DeadLetterTargetArn, ":")+1:]
	u, err := s.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return "", fmt.Errorf("sqstransport: DLQ %s: %w", name, err)
	}
	return aws.ToString(u.QueueUrl), nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// otelScope names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var otelScope = reflect.TypeFor[Publisher]().PkgPath()
