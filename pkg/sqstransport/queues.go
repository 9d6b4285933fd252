package sqstransport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// DLQSuffix is appended to a queue's name to name its dead-letter queue.
const DLQSuffix = "-dlq"

// retention is the longest SQS allows (14 days), on both queues. A standard
// queue's message keeps its original enqueue time when moved to the DLQ, so
// the DLQ must keep messages at least as long as the source for a redrive to
// find them; and the consumers' dedupe window (15 days) then outlasts any
// copy SQS can still deliver.
const retention = 14 * 24 * time.Hour

// RedrivePolicy is the JSON shape of the RedrivePolicy queue attribute.
//
// maxReceiveCount comes in two forms: SQS takes it as a string when the
// attribute is set, but GetQueueAttributes hands it back as a JSON number
// (AWS's own examples show {"maxReceiveCount":5}; moto does the same), while
// fauxqs echoes the string it was given. Unmarshalling accepts either form
// (a whole number from 1 to 1000) and keeps it in MaxReceiveCount as
// decimal text; marshalling writes the string, which every server takes.
type RedrivePolicy struct {
	DeadLetterTargetArn string `json:"deadLetterTargetArn"`
	MaxReceiveCount     string `json:"maxReceiveCount"`
}

// UnmarshalJSON reads maxReceiveCount as a number or a string.
func (p *RedrivePolicy) UnmarshalJSON(b []byte) error {
	var raw struct {
		DeadLetterTargetArn string          `json:"deadLetterTargetArn"`
		MaxReceiveCount     json.RawMessage `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	n := string(raw.MaxReceiveCount)
	if len(n) > 0 && n[0] == '"' {
		if err := json.Unmarshal(raw.MaxReceiveCount, &n); err != nil {
			return err
		}
	}
	if len(raw.MaxReceiveCount) > 0 {
		v, err := strconv.Atoi(n)
		if err != nil || v < 1 || v > 1000 {
			return fmt.Errorf("sqstransport: RedrivePolicy maxReceiveCount %s: want a whole number 1..1000, as a number or a string", raw.MaxReceiveCount)
		}
		n = strconv.Itoa(v)
	}
	*p = RedrivePolicy{DeadLetterTargetArn: raw.DeadLetterTargetArn, MaxReceiveCount: n}
	return nil
}

// EnsureQueue makes sure the standard queue name and its dead-letter queue
// name+"-dlq" exist, with a RedrivePolicy that moves a message to the DLQ
// after maxReceiveCount receives, and the given visibility timeout on the
// source queue. It returns both queue URLs.
//
// It is idempotent and converges: the DLQ is created first (the source's
// RedrivePolicy needs its ARN); a queue that already exists with other
// attributes (SQS answers QueueNameExists) gets the wanted attributes set
// on it instead, so calling it again with new settings updates the queues.
func EnsureQueue(ctx context.Context, c *sqs.Client, name string, maxReceiveCount int, visibilityTimeout time.Duration) (queueURL, dlqURL string, err error) {
	if maxReceiveCount < 1 || maxReceiveCount > 1000 {
		return "", "", fmt.Errorf("sqstransport: maxReceiveCount %d out of SQS's range 1..1000", maxReceiveCount)
	}
	if visibilityTimeout < 0 || visibilityTimeout > 12*time.Hour {
		return "", "", fmt.Errorf("sqstransport: visibility timeout %v out of SQS's range 0..12h", visibilityTimeout)
	}
	if visibilityTimeout%time.Second != 0 {
		return "", "", fmt.Errorf("sqstransport: visibility timeout %v: SQS takes whole seconds", visibilityTimeout)
	}
	seconds := func(d time.Duration) string { return strconv.Itoa(int(d / time.Second)) }

	dlqURL, err = ensure(ctx, c, name+DLQSuffix, map[string]string{
		string(types.QueueAttributeNameMessageRetentionPeriod): seconds(retention),
	})
	if err != nil {
		return "", "", err
	}
	attrs, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(dlqURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return "", "", fmt.Errorf("sqstransport: get ARN of %s: %w", name+DLQSuffix, err)
	}
	dlqARN := attrs.Attributes[string(types.QueueAttributeNameQueueArn)]
	if dlqARN == "" {
		return "", "", fmt.Errorf("sqstransport: %s has no QueueArn attribute", name+DLQSuffix)
	}
	policy, err := json.Marshal(RedrivePolicy{
		DeadLetterTargetArn: dlqARN,
		MaxReceiveCount:     strconv.Itoa(maxReceiveCount),
	})
	if err != nil {
		return "", "", err
	}
	queueURL, err = ensure(ctx, c, name, map[string]string{
		string(types.QueueAttributeNameRedrivePolicy):          string(policy),
		string(types.QueueAttributeNameVisibilityTimeout):      seconds(visibilityTimeout),
		string(types.QueueAttributeNameMessageRetentionPeriod): seconds(retention),
	})
	if err != nil {
		return "", "", err
	}
	return queueURL, dlqURL, nil
}

// ensure creates the queue with attrs, or, if it exists with different
// attributes, sets attrs on it.
func ensure(ctx context.Context, c *sqs.Client, name string, attrs map[string]string) (string, error) {
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err == nil {
		return aws.ToString(out.QueueUrl), nil
	}
	var exists *types.QueueNameExists
	if !errors.As(err, &exists) {
		return "", fmt.Errorf("sqstransport: create queue %s: %w", name, err)
	}
	got, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		return "", fmt.Errorf("sqstransport: get URL of queue %s: %w", name, err)
	}
	url := aws.ToString(got.QueueUrl)
	if _, err := c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(url), Attributes: attrs}); err != nil {
		return "", fmt.Errorf("sqstransport: update attributes of queue %s: %w", name, err)
	}
	return url, nil
}
