package sqstransport

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// ParkAttributePrefix starts the names of the message attributes park adds
// (park_reason, park_source_queue, park_source_message_id). Redrive strips
// them: a redriven copy is a fresh attempt, not a parked one.
const ParkAttributePrefix = "park_"

// parkSourceMessageID is the attribute in which park names the SQS
// MessageId of the copy it parked; Redrive reads it to tell a copy it sent
// itself, parked again, from a message the DLQ held at the start.
const parkSourceMessageID = ParkAttributePrefix + "source_message_id"

// Redrive moves messages from the dead-letter queue dlqURL back to destURL
// and returns how many it moved. Each moved copy gets a new SQS MessageId
// and keeps its body, so its event_id, the dedupe key, is unchanged: a copy
// whose effect was already committed is a duplicate at the consumer (0
// rows inserted, acked), one that was not is applied.
//
// It first asks the server for a message move task (StartMessageMoveTask,
// as the SQS console's "redrive" does) and waits for it to finish. Servers
// that do not implement it (fauxqs answers InvalidAction, moto an HTML 500
// page; see unsupported for every answer taken to mean so) get the manual
// path instead: receive from the DLQ, SendMessageBatch the same bodies and
// message attributes (minus the park_* ones) to destURL, then delete from
// the DLQ what was sent, 10 at a time. A crash between send and delete
// leaves a copy in both queues, which the consumer deduplicates.
//
// The move-task path has run against no real server: neither server the
// tests run on (fauxqs, moto) implements StartMessageMoveTask, and AWS and
// LocalStack cannot run there. It is tested only against a replay of the
// responses SQS documents for it (movetask_test.go); the manual path is the
// one every test server exercises.
//
// Once the server has taken a move task, only the task moves messages:
// if ctx ends while it runs, or its polls keep failing, Redrive cancels
// it (a task left running would go on moving messages after Redrive had
// reported, and keep the next redrive of that queue from starting) and
// returns what it had moved, with the reason.
//
// max > 0 moves at most max messages, which a move task cannot bound, so it
// always takes the manual path. max <= 0 moves what the DLQ held when
// Redrive started: a message parked again while Redrive runs (it is still
// poison) is left in the DLQ instead of bouncing between the two queues.
func Redrive(ctx context.Context, c *sqs.Client, dlqURL, destURL string, max int) (moved int, err error) {
	if dlqURL == "" || destURL == "" {
		return 0, errors.New("sqstransport: redrive: the DLQ and destination URLs are required")
	}
	if dlqURL == destURL {
		return 0, errors.New("sqstransport: redrive: the DLQ and the destination are the same queue")
	}
	if max <= 0 {
		n, started, err := moveTask(ctx, c, dlqURL, destURL)
		if err == nil || started || !unsupported(err) {
			return n, err
		}
		// Not implemented by this server: do it by hand, bounded by what
		// the DLQ holds now.
		if max, err = queueDepth(ctx, c, dlqURL); err != nil || max == 0 {
			return 0, err
		}
	}
	return redriveManually(ctx, c, dlqURL, destURL, max)
}

// moveTask runs a StartMessageMoveTask from dlqURL to destURL to its end.
// started says the server took the task: from then on, a failure is the
// task's, never a sign that the server lacks move tasks. A task Redrive
// stops waiting for (ctx ended, or its polls kept failing) is cancelled,
// so that it does not go on moving messages after Redrive has reported.
func moveTask(ctx context.Context, c *sqs.Client, dlqURL, destURL string) (moved int, started bool, err error) {
	src, err := queueARN(ctx, c, dlqURL)
	if err != nil {
		return 0, false, err
	}
	dst, err := queueARN(ctx, c, destURL)
	if err != nil {
		return 0, false, err
	}
	start, err := c.StartMessageMoveTask(ctx, &sqs.StartMessageMoveTaskInput{SourceArn: &src, DestinationArn: &dst})
	if err != nil {
		return 0, false, fmt.Errorf("sqstransport: redrive: start message move task: %w", err)
	}
	handle := aws.ToString(start.TaskHandle)
	failedPolls := 0
	for {
		out, err := c.ListMessageMoveTasks(ctx, &sqs.ListMessageMoveTasksInput{SourceArn: &src, MaxResults: aws.Int32(10)})
		switch {
		case ctx.Err() != nil: // ended during the poll
			return cancelMoveTask(ctx, c, handle, moved, ctx.Err())
		case err != nil:
			if failedPolls++; failedPolls == movePollTries {
				return cancelMoveTask(ctx, c, handle, moved, fmt.Errorf("list message move tasks: %w", err))
			}
		default:
			failedPolls = 0
			if task := ourTask(out.Results, handle); task != nil {
				moved = int(task.ApproximateNumberOfMessagesMoved)
				switch aws.ToString(task.Status) {
				case "COMPLETED":
					return moved, true, nil
				case "FAILED", "CANCELLED":
					return moved, true, fmt.Errorf("sqstransport: redrive: message move task %s: %s", aws.ToString(task.Status), aws.ToString(task.FailureReason))
				}
			}
		}
		select {
		case <-ctx.Done():
			return cancelMoveTask(ctx, c, handle, moved, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// movePollTries is how many polls of a move task in a row may fail (each
// already retried by the SDK) before Redrive stops waiting for it.
const movePollTries = 5

// ourTask is the task of handle among a source's listed tasks. Finished
// tasks may be listed without their handle: the most recent is then ours.
func ourTask(tasks []types.ListMessageMoveTasksResultEntry, handle string) *types.ListMessageMoveTasksResultEntry {
	for i := range tasks {
		if aws.ToString(tasks[i].TaskHandle) == handle {
			return &tasks[i]
		}
	}
	if len(tasks) > 0 {
		return &tasks[0]
	}
	return nil
}

// cancelMoveTask cancels the move task Redrive stops waiting for because
// of why, on a context of its own (ctx may be what ended), and returns
// what it had moved by then: the cancel's count, else the last poll's.
func cancelMoveTask(ctx context.Context, c *sqs.Client, handle string, moved int, why error) (int, bool, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out, err := c.CancelMessageMoveTask(cctx, &sqs.CancelMessageMoveTaskInput{TaskHandle: &handle})
	if err != nil {
		return moved, true, fmt.Errorf("sqstransport: redrive: stopped waiting for message move task %s (%w), and cancelling it failed, so it may still be moving messages: %v", handle, why, err)
	}
	return int(out.ApproximateNumberOfMessagesMoved), true, fmt.Errorf("sqstransport: redrive: message move task cancelled after %d moved: %w", out.ApproximateNumberOfMessagesMoved, why)
}

// unsupported reports whether err says the server does not implement the
// operation, in any of the ways servers say it:
//   - an error code naming an unknown or unsupported operation (fauxqs:
//     InvalidAction; AWS: UnsupportedOperation, sent with the legacy
//     "AWS.SimpleQueueService." prefix in x-amzn-query-error), at any status;
//   - a 400, 404, 405 or 501 whose body is no SQS error (plain text, HTML,
//     empty), and any 501;
//   - a 500 whose body is no SQS error: moto answers an operation it lacks
//     with an HTML "500 Internal Server Error" page.
//
// A real SQS error about the request (QueueDoesNotExist, AccessDenied, a
// JSON InternalError, ...) is not "unsupported": Redrive returns it rather
// than hide it behind the manual path.
func unsupported(err error) bool {
	status := 0
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		code := api.ErrorCode()
		switch code[strings.LastIndex(code, ".")+1:] {
		case "InvalidAction", "UnsupportedOperation", "NotImplemented", "UnknownOperation", "UnknownOperationException":
			return true
		case "UnknownError", "":
			// The SDK's name for a body without an error type: not an SQS
			// error, so the status decides below.
		default:
			return status == http.StatusNotImplemented
		}
	}
	if status == 0 {
		return false // no HTTP answer at all (network, context): not a verdict on the API
	}
	switch status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed,
		http.StatusNotImplemented, http.StatusInternalServerError:
		return true
	}
	return false
}

func queueARN(ctx context.Context, c *sqs.Client, url string) (string, error) {
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: &url, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		return "", fmt.Errorf("sqstransport: redrive: ARN of %s: %w", queueName(url), err)
	}
	arn := out.Attributes[string(types.QueueAttributeNameQueueArn)]
	if arn == "" {
		return "", fmt.Errorf("sqstransport: redrive: %s has no QueueArn", queueName(url))
	}
	return arn, nil
}

// queueDepth is ApproximateNumberOfMessages + ApproximateNumberOfMessagesNotVisible.
func queueDepth(ctx context.Context, c *sqs.Client, url string) (int, error) {
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		return 0, fmt.Errorf("sqstransport: redrive: depth of %s: %w", queueName(url), err)
	}
	total := 0
	for _, k := range []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages,
		types.QueueAttributeNameApproximateNumberOfMessagesNotVisible} {
		n, _ := strconv.Atoi(out.Attributes[string(k)])
		total += n
	}
	return total, nil
}

// redriveManually moves up to max messages, up to 10 per round trip.
func redriveManually(ctx context.Context, c *sqs.Client, dlqURL, destURL string, max int) (int, error) {
	moved := 0
	var errs []error
	sent := map[string]bool{} // SQS MessageIds of the copies sent to destURL
	for moved < max && len(errs) < 5 {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:              &dlqURL,
			MaxNumberOfMessages:   int32(min(10, max-moved)),
			WaitTimeSeconds:       1,
			VisibilityTimeout:     30, // time to re-send and delete before another reader sees it
			MessageAttributeNames: []string{"All"},
		})
		if err != nil {
			return moved, fmt.Errorf("sqstransport: redrive: receive from %s: %w", queueName(dlqURL), err)
		}
		if len(out.Messages) == 0 {
			break // drained (or the rest is in flight elsewhere)
		}
		// A copy this redrive sent that its consumer parked again (it is
		// still poison) is left in the DLQ, uncounted, however often it is
		// received: sent back, it would bounce, and take the place of a
		// message the DLQ held at the start.
		msgs := slices.DeleteFunc(out.Messages, func(m types.Message) bool {
			return sent[aws.ToString(m.MessageAttributes[parkSourceMessageID].StringValue)]
		})
		entries := make([]types.SendMessageBatchRequestEntry, len(msgs))
		for i, m := range msgs {
			attrs := make(map[string]types.MessageAttributeValue, len(m.MessageAttributes))
			for k, v := range m.MessageAttributes {
				if !strings.HasPrefix(k, ParkAttributePrefix) {
					attrs[k] = v
				}
			}
			entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: m.Body, MessageAttributes: attrs}
		}
		// Batches that fit a request: one receive of large messages can
		// hold more bytes than one SendMessageBatch may carry.
		for _, batch := range inBatches(entries, entrySize) {
			n, failed, err := resend(ctx, c, dlqURL, destURL, batch, msgs, sent)
			moved += n
			errs = append(errs, failed...)
			if err != nil {
				return moved, err
			}
		}
	}
	if len(errs) > 0 {
		return moved, fmt.Errorf("sqstransport: redrive: %d entries failed: %w", len(errs), errors.Join(errs...))
	}
	return moved, nil
}

// resend sends batch (entries whose Id is the index of their message in
// received) to destURL, then deletes from dlqURL the messages it accepted.
// It returns how many it deleted, the entries that failed, and an error
// that ends the redrive; ids gets the MessageIds of the copies sent.
func resend(ctx context.Context, c *sqs.Client, dlqURL, destURL string, batch []types.SendMessageBatchRequestEntry, received []types.Message, ids map[string]bool) (int, []error, error) {
	sent, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &destURL, Entries: batch})
	if err != nil {
		return 0, nil, fmt.Errorf("sqstransport: redrive: send to %s: %w", queueName(destURL), err)
	}
	for _, s := range sent.Successful {
		ids[aws.ToString(s.MessageId)] = true
	}
	var errs []error
	for _, f := range sent.Failed {
		errs = append(errs, fmt.Errorf("send %s: %s %s", aws.ToString(f.Id), aws.ToString(f.Code), aws.ToString(f.Message)))
	}
	dels := make([]types.DeleteMessageBatchRequestEntry, 0, len(sent.Successful))
	for _, s := range sent.Successful {
		i, _ := strconv.Atoi(aws.ToString(s.Id))
		dels = append(dels, types.DeleteMessageBatchRequestEntry{Id: s.Id, ReceiptHandle: received[i].ReceiptHandle})
	}
	if len(dels) == 0 {
		return 0, errs, nil
	}
	del, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &dlqURL, Entries: dels})
	if err != nil {
		// Sent but not deleted: the copies in the DLQ come back after
		// their visibility timeout and a later redrive sends them again;
		// consumers deduplicate by event_id.
		return 0, errs, fmt.Errorf("sqstransport: redrive: delete from %s after sending %d: %w", queueName(dlqURL), len(dels), err)
	}
	for _, f := range del.Failed {
		errs = append(errs, fmt.Errorf("delete %s: %s %s", aws.ToString(f.Id), aws.ToString(f.Code), aws.ToString(f.Message)))
	}
	return len(del.Successful), errs, nil
}

// entrySize is what an entry counts against a batch's size limit.
func entrySize(e types.SendMessageBatchRequestEntry) int {
	n := len(aws.ToString(e.MessageBody))
	for k, v := range e.MessageAttributes {
		n += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	return n
}
