package sqstransport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// SQS limits for one SendMessageBatch call.
const (
	maxBatchEntries = 10
	maxBatchBytes   = 256 * 1024
)

// Publisher implements outbox.Publisher on an SQS queue.
//
// Its calls are made by sender goroutines that outlive a PublishBatch: the
// SDK's middleware runs deep, and a fresh goroutine per call spent a tenth
// of the relay's CPU growing its stack. Senders start on demand, at most
// about one per slot, and end after senderIdle without work, so an idle
// Publisher holds none and needs no Close.
type Publisher struct {
	client   *sqs.Client
	queueURL string
	slots    chan struct{} // one per SendMessageBatch call in flight, across PublishBatch calls
	calls    chan call     // to an idle sender
	idle     time.Duration // senderIdle; tests shorten it
}

// call is one SendMessageBatch for a sender to make; done is called after.
type call struct {
	ctx   context.Context
	chunk []outbox.Message
	fail  func(uuid.UUID, error)
	done  func()
}

// senderIdle is how long a sender waits for its next call before it ends.
const senderIdle = 5 * time.Second

// DefaultInFlight is NewPublisher's limit when given none: what the relay's
// default two workers had with four calls each.
const DefaultInFlight = 8

// NewPublisher returns a Publisher to queueURL that keeps up to inFlight
// SendMessageBatch calls in flight at once (<= 0 means DefaultInFlight): a
// relay to SQS is bound by round trips, not by PostgreSQL. The limit is the
// Publisher's, shared by concurrent PublishBatch calls, so the calls of one
// relay worker's batch fill the slots another worker leaves while it claims
// or marks in the database, and the queue sees a steady inFlight calls.
func NewPublisher(client *sqs.Client, queueURL string, inFlight int) *Publisher {
	if inFlight <= 0 {
		inFlight = DefaultInFlight
	}
	return &Publisher{client: client, queueURL: queueURL, slots: make(chan struct{}, inFlight), calls: make(chan call), idle: senderIdle}
}

// start hands c to an idle sender, or to a new one if none is idle. The
// caller holds a slot for c, which the sender releases.
func (p *Publisher) start(c call) {
	select {
	case p.calls <- c:
	default:
		go p.sender(c)
	}
}

// sender makes c and then every call it is handed, until it has waited
// p.idle for one.
func (p *Publisher) sender(c call) {
	idle := time.NewTimer(p.idle)
	defer idle.Stop()
	for {
		p.send(c.ctx, c.chunk, c.fail)
		<-p.slots
		c.done()
		idle.Reset(p.idle)
		select {
		case c = <-p.calls:
		case <-idle.C:
			return
		}
	}
}

// errNotInResponse is the failure of an entry that a SendMessageBatch
// response lists neither as succeeded nor as failed.
var errNotInResponse = errors.New("sqs: the SendMessageBatch response did not list the message as sent")

// PublishBatch sends msgs in SQS batches and reports each message that SQS
// did not accept. A call that fails as a whole fails all of its entries, and
// an entry missing from the response's Successful list counts as failed.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	var (
		mu     sync.Mutex
		failed = map[uuid.UUID]error{}
		wg     sync.WaitGroup
	)
	fail := func(id uuid.UUID, err error) {
		mu.Lock()
		failed[id] = err
		mu.Unlock()
	}
	for _, chunk := range chunks(msgs) {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			// Not sent: the rest of the batch fails with the deadline and
			// is rescheduled, as a call cut by it would be.
			for _, m := range chunk {
				fail(m.EventID, ctx.Err())
			}
			continue
		}
		wg.Add(1)
		p.start(call{ctx: ctx, chunk: chunk, fail: fail, done: wg.Done})
	}
	wg.Wait()
	return failed, nil
}

// send puts one chunk on the queue with one SendMessageBatch call and
// reports each message that is not known to be accepted. An entry's Id is
// its index in the chunk, which is all the call needs to be unique.
func (p *Publisher) send(ctx context.Context, chunk []outbox.Message, fail func(uuid.UUID, error)) {
	entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
	for i, m := range chunk {
		entries[i] = types.SendMessageBatchRequestEntry{
			Id:                &entryIDs[i],
			MessageBody:       aws.String(string(m.Body)),
			MessageAttributes: stringAttributes(m.Attributes),
		}
	}
	out, err := p.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &p.queueURL, Entries: entries})
	if err != nil {
		for _, m := range chunk {
			fail(m.EventID, err)
		}
		return
	}
	// Only an entry listed as Successful counts as sent: one the response
	// lists nowhere is unknown, and resending it risks a duplicate where
	// trusting it risks a loss.
	var listed [maxBatchEntries]bool
	for _, s := range out.Successful {
		if i, ok := entryIndex(s.Id, len(chunk)); ok {
			listed[i] = true
		}
	}
	for _, f := range out.Failed {
		if i, ok := entryIndex(f.Id, len(chunk)); ok && !listed[i] {
			listed[i] = true
			fail(chunk[i].EventID, fmt.Errorf("sqs rejected the message: %s: %s", aws.ToString(f.Code), aws.ToString(f.Message)))
		}
	}
	for i, m := range chunk {
		if !listed[i] {
			fail(m.EventID, errNotInResponse)
		}
	}
}

// entryIDs are the entries' Ids, "0" to "9"; the request points at them
// (the SDK only reads its input).
var entryIDs = func() (ids [maxBatchEntries]string) {
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	return ids
}()

// entryIndex is the index an Id of a response names, if it names one of n.
func entryIndex(id *string, n int) (int, bool) {
	i, err := strconv.Atoi(aws.ToString(id))
	return i, err == nil && i >= 0 && i < n
}

// chunks splits msgs into groups that fit one SendMessageBatch call.
func chunks(msgs []outbox.Message) [][]outbox.Message {
	return inBatches(msgs, func(m outbox.Message) int {
		n := len(m.Body)
		for k, v := range m.Attributes {
			n += len(k) + len(v) + len("String")
		}
		return n
	})
}

// inBatches splits items, in order, into runs that fit one
// SendMessageBatch call: at most maxBatchEntries, and at most maxBatchBytes
// by size (a body and its attributes) unless one item alone is larger,
// which goes alone and is the server's to refuse.
func inBatches[T any](items []T, size func(T) int) [][]T {
	var out [][]T
	var cur []T
	total := 0
	for _, it := range items {
		n := size(it)
		if len(cur) == maxBatchEntries || (len(cur) > 0 && total+n > maxBatchBytes) {
			out = append(out, cur)
			cur, total = nil, 0
		}
		cur = append(cur, it)
		total += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func stringAttributes(m map[string]string) map[string]types.MessageAttributeValue {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]types.MessageAttributeValue, len(m))
	for k, v := range m {
		out[k] = types.MessageAttributeValue{DataType: &stringType, StringValue: aws.String(v)}
	}
	return out
}

// stringType is every attribute's DataType, shared (the SDK only reads it).
var stringType = "String"
