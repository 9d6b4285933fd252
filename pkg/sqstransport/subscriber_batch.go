package sqstransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/outage"
)

// BatchHandler processes the decodable messages of one receive together
// and returns one error per delivery, in the same order, each with the
// meaning a Handler's error has for its message: nil once its effect is
// committed (the message is deleted), a permanent error (parked in the
// DLQ), any other (left for redelivery after its backoff). Returning fewer
// errors than deliveries is a bug; the missing ones are treated as
// transient failures, so nothing is deleted that was not vouched for,
// whatever else the call did (it panicked, ran past HandlerTimeout or met
// an outage); errors past the last delivery are ignored.
//
// Each Delivery's Ctx carries that message's own trace span (a child of
// the traceparent it arrived with): work done for one message belongs in
// its Ctx, so that its trace continues through whatever it produces.
//
// A handler that panics is recovered (the panic logged with its stack)
// and, when the receive held more than one message, called again with
// each of them alone: only a message whose own call panics fails as a
// panic, counting towards MaxPanics; the others are settled on their own
// results. A call that runs past HandlerTimeout is treated alike: each
// delivery it failed is handed over again alone, with a deadline of its
// own, so one hung message does not take its batch-mates back to the
// queue with it. So it must be safe to call again with messages it
// handled in part, as an idempotent consumer is.
type BatchHandler func(ctx context.Context, ds []Delivery) []error

// NewBatchSubscriber returns a Subscriber that hands each receive (up to
// MaxMessages, always asked for in full) to handler at once, so a handler
// can apply a receive's messages in one database transaction. Concurrency
// counts receives being handled at once. Undecodable messages are parked
// before the handler sees the rest; the delivery contract per message is
// the same as NewSubscriber's.
func NewBatchSubscriber(client *sqs.Client, cfg SubscriberConfig, handler BatchHandler) (*Subscriber, error) {
	if handler == nil {
		return nil, errors.New("sqstransport: NewBatchSubscriber needs a handler")
	}
	s, err := newSubscriber(client, cfg, nil)
	if err != nil {
		return nil, err
	}
	s.batch = handler
	return s, nil
}

// processBatch decodes a receive's messages, runs the batch handler over
// the decodable ones with their visibility extended meanwhile, and settles
// each message on its own error.
func (s *Subscriber) processBatch(ctx context.Context, msgs []types.Message) {
	type item struct {
		m    types.Message
		span trace.Span
		log  *slog.Logger
	}
	items := make([]item, 0, len(msgs))
	ds := make([]Delivery, 0, len(msgs))
	receipts := make([]*string, 0, len(msgs))
	for _, m := range msgs {
		d, log, ok := s.decode(ctx, m)
		if !ok {
			continue
		}
		var span trace.Span
		d.Ctx, span = s.startSpan(ctx, d)
		items = append(items, item{m: m, span: span, log: log})
		ds = append(ds, d)
		receipts = append(receipts, m.ReceiptHandle)
	}
	if len(ds) == 0 {
		return
	}
	stopHeartbeat := s.heartbeat(ctx, receipts, s.log)
	t0 := time.Now()
	// One deadline for the receive, as for a single message: the batch's
	// transaction must end before the messages' visibility does.
	timedOut, results := s.handleBatch(ctx, ds)
	stopHeartbeat()
	took := time.Since(t0) / time.Duration(len(ds))
	for i, it := range items {
		err := results[i]
		s.settle(ds[i].Ctx, it.span, it.m, ds[i], verdict{err: err, timedOut: timedOut[i] && err != nil}, took, it.log)
		it.span.End()
	}
}

// handleBatch is handle for a receive: the batch handler within
// HandlerTimeout, panics recovered, and, while a failure is an outage the
// Gate confirms (the first that outage.Unavailable says looks like one,
// whichever message it is), the receive held (the heartbeat keeps it
// invisible) and handed over again once the gate reopens, so an outage
// costs no message a delivery. It gives up, returning the last attempt's results, when the
// drain starts or MaxExtension has passed. timedOut[i] says that
// delivery i's call ran past its deadline.
//
// A panic says nothing of which message caused it, so the receive's
// deliveries are then handed over again one at a time (oneByOne): only
// the one that panics fails as a panic and counts towards MaxPanics; the
// others are applied and deleted. A handler is idempotent, so whatever the
// panicking call had committed is a duplicate the second time. A call that
// runs past its deadline hands its failed deliveries over one at a time
// too (lateOneByOne), unless the Gate calls it an outage.
func (s *Subscriber) handleBatch(ctx context.Context, ds []Delivery) (timedOut []bool, results []error) {
	deadline := time.Now().Add(s.cfg.MaxExtension)
	for {
		var panicked bool
		late := s.within(ctx, func(hctx context.Context) { panicked, results = s.callBatch(hctx, ds) })
		results = oneEach(results, len(ds))
		if panicked && len(ds) > 1 {
			return s.oneByOne(ctx, ds)
		}
		timedOut = make([]bool, len(ds))
		for i := range timedOut {
			timedOut[i] = late
		}
		// The gate is shown the first failure that looks like an outage,
		// as the single-message path shows it each handler error: one
		// message failing on its own must not hide a batch-mate's refused
		// connection.
		var suspect error
		for _, err := range results {
			if err != nil && !IsPermanent(err) && !errs.IsPanic(err) && outage.Unavailable(err) {
				suspect = err
				break
			}
		}
		if suspect == nil || panicked || !s.cfg.Gate.Suspect(ctx, suspect) {
			if late && len(ds) > 1 {
				return s.lateOneByOne(ctx, ds, results, deadline)
			}
			return timedOut, results
		}
		s.log.Warn("dependency unavailable: holding the receive until it answers", "error", suspect, "messages", len(ds))
		if s.waitGate(ctx, deadline) != nil {
			return timedOut, results
		}
	}
}

// oneEach is a batch handler's results as exactly one per delivery, n: a
// result missing from the end (a handler bug) is a transient failure, so
// nothing is deleted that was not vouched for, and an extra one is
// dropped. Every path after the call (the Gate, the late one-at-a-time
// pass, the settling) then reads a full slice.
func oneEach(results []error, n int) []error {
	if len(results) == n {
		return results
	}
	out := make([]error, n)
	copy(out, results)
	for i := len(results); i < n; i++ {
		out[i] = fmt.Errorf("sqstransport: batch handler returned %d results for %d messages", len(results), n)
	}
	return out
}

// oneByOne hands each delivery to the batch handler on its own, each call
// within its own HandlerTimeout and its panic recovered, after a call over
// the whole receive panicked.
func (s *Subscriber) oneByOne(ctx context.Context, ds []Delivery) (timedOut []bool, results []error) {
	s.log.Warn("batch handler panicked: handing the receive's messages over one at a time", "messages", len(ds))
	timedOut, results = make([]bool, len(ds)), make([]error, len(ds))
	for i := range ds {
		timedOut[i], results[i] = s.callOne(ctx, ds[i])
	}
	return timedOut, results
}

// callOne hands d alone to the batch handler, within its own
// HandlerTimeout and its panic recovered.
func (s *Subscriber) callOne(ctx context.Context, d Delivery) (timedOut bool, err error) {
	var r []error
	timedOut = s.within(ctx, func(hctx context.Context) { _, r = s.callBatch(hctx, []Delivery{d}) })
	if len(r) == 0 {
		return timedOut, fmt.Errorf("sqstransport: batch handler returned no result for its one message")
	}
	return timedOut, r[0]
}

// lateOneByOne hands each delivery that failed in a call past its deadline
// over again on its own, with a deadline of its own. One hung message holds
// the whole receive's transaction until the deadline, and its mates, which
// the handler could then only fail on the spent context, would otherwise
// come back with it receive after receive, towards maxReceiveCount and the
// DLQ. Now only the hung one times out again. A delivery that succeeded or
// was refused keeps its result; once the Gate confirms an outage, the drain
// starts or a call could outlast deadline (the last visibility extension),
// the rest keep theirs and come back later.
func (s *Subscriber) lateOneByOne(ctx context.Context, ds []Delivery, results []error, deadline time.Time) (timedOut []bool, _ []error) {
	s.log.Warn("batch handler passed its deadline: handing the receive's failed messages over one at a time",
		"messages", len(ds), "handler_timeout", s.cfg.HandlerTimeout)
	timedOut = make([]bool, len(ds))
	stop := false
	for i := range ds {
		if results[i] == nil || IsPermanent(results[i]) {
			continue
		}
		if stop = stop || s.stopping.Err() != nil || time.Now().Add(s.cfg.HandlerTimeout).After(deadline); stop {
			timedOut[i] = true // the batch's verdict stands
			continue
		}
		timedOut[i], results[i] = s.callOne(ctx, ds[i])
		stop = timedOut[i] && s.cfg.Gate.Suspect(ctx, results[i])
	}
	return timedOut, results
}

// callBatch runs the batch handler and turns a panic into the same
// *errs.PanicError for every delivery (panicked set), logged with its stack.
func (s *Subscriber) callBatch(ctx context.Context, ds []Delivery) (panicked bool, results []error) {
	defer func() {
		if v := recover(); v != nil {
			err := &errs.PanicError{Value: v}
			args := []any{"panic", err, "messages", len(ds), "stack", string(debug.Stack())}
			if len(ds) == 1 {
				args = append(args, "event_id", ds[0].Envelope.EventID, "sqs_message_id", ds[0].SQSMessageID)
			}
			s.log.Error("batch handler panicked", args...)
			panicked, results = true, make([]error, len(ds))
			for i := range results {
				results[i] = err
			}
		}
	}()
	bounded, release := boundTo(ctx, ds)
	defer release()
	return false, s.batch(ctx, bounded)
}

// boundTo returns copies of ds whose Ctx, keeping its values (the
// message's span), ends with hctx: its deadline (HandlerTimeout) and its
// cancellation. A batch handler runs each message's work in its Ctx, so
// the deadline must reach it there, not only the handler's own ctx.
// release frees what the copies hold once the handler has returned.
func boundTo(hctx context.Context, ds []Delivery) (bounded []Delivery, release func()) {
	bounded = make([]Delivery, len(ds))
	cancels := make([]func(), 0, 2*len(ds))
	deadline, ok := hctx.Deadline()
	for i, d := range ds {
		var c context.Context
		var cancel context.CancelFunc
		if ok {
			c, cancel = context.WithDeadline(context.WithoutCancel(d.Ctx), deadline)
		} else {
			c, cancel = context.WithCancel(context.WithoutCancel(d.Ctx))
		}
		stop := context.AfterFunc(hctx, cancel)
		d.Ctx = c
		bounded[i] = d
		cancels = append(cancels, func() { stop() }, cancel)
	}
	return bounded, func() {
		for _, f := range cancels {
			f()
		}
	}
}

// extend renews the visibility of receipts, ten per call, each call
// within callTimeout (see setVisibility).
func (s *Subscriber) extend(ctx context.Context, receipts []*string, log *slog.Logger) {
	if len(receipts) == 1 {
		s.setVisibility(ctx, receipts[0], s.cfg.Visibility, log)
		return
	}
	for i := 0; i < len(receipts); i += 10 {
		chunk := receipts[i:min(i+10, len(receipts))]
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(chunk))
		for j, r := range chunk {
			entries[j] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), ReceiptHandle: r,
				VisibilityTimeout: int32(s.cfg.Visibility / time.Second)}
		}
		cctx, cancel := context.WithTimeout(ctx, s.callTimeout)
		out, err := s.client.ChangeMessageVisibilityBatch(cctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &s.cfg.QueueURL, Entries: entries})
		cancel()
		switch {
		case err != nil:
			log.Warn("change visibility failed", "error", err, "count", len(chunk))
		case len(out.Failed) > 0:
			log.Warn("change visibility failed for some messages", "failed", len(out.Failed))
		}
	}
}
