// Command redrive moves parked messages from a dead-letter queue back to
// its source queue, once the cause that parked them is fixed.
//
//	go run ./cmd/redrive -source payments-events-dlq [-dest payments-events] [-max N]
//
// -source and -dest are queue names or URLs; -dest defaults to the source's
// name minus "-dlq". Without -max it moves what the DLQ holds when it
// starts, through StartMessageMoveTask where the server has it (AWS,
// LocalStack; that path is tested against replayed SQS responses only) and
// otherwise by receive → send (same body and attributes, minus park_*) →
// delete, 10 at a time (fauxqs, moto); -max N moves at most N,
// always the second way. Redriven copies get a new SQS MessageId and keep
// their event_id, so consumers apply each event at most once whatever
// happened before (see pkg/sqstransport.Redrive).
//
// The endpoint comes from the standard AWS_ENDPOINT_URL (fauxqs or
// LocalStack locally; unset means real AWS). It prints how many it moved.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command with its arguments; it returns the exit status: 2 for
// bad arguments, before any queue is touched, 1 for a failure.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("redrive", flag.ContinueOnError)
	fs.SetOutput(stderr)
	source := fs.String("source", "", "the dead-letter queue to empty (name or URL), e.g. payments-events-dlq")
	dest := fs.String("dest", "", "where to move the messages (name or URL) [source minus "+sqstransport.DLQSuffix+"]")
	max := fs.Int("max", 0, "move at most this many messages (0: what the DLQ holds at start)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "redrive: "+format+"\n", a...)
		fs.Usage()
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usage("unexpected argument %q: every setting is a flag, and none after it was read", fs.Arg(0))
	case *source == "":
		return usage("-source is required")
	case *max < 0:
		return usage("-max %d: want a count, or 0 for what the DLQ holds at start", *max)
	case *timeout <= 0:
		return usage("-timeout %v: want a positive duration", *timeout)
	}
	if *dest == "" {
		name := queueName(*source)
		if !strings.HasSuffix(name, sqstransport.DLQSuffix) {
			return usage("-source %s does not end in %s: name the destination with -dest", name, sqstransport.DLQSuffix)
		}
		*dest = strings.TrimSuffix(name, sqstransport.DLQSuffix)
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	fail := func(err error) int {
		fmt.Fprintln(stderr, "redrive:", err)
		return 1
	}
	c, err := sqstransport.NewClient(ctx)
	if err != nil {
		return fail(err)
	}
	srcURL, err := resolve(ctx, c, *source)
	if err != nil {
		return fail(err)
	}
	dstURL, err := resolve(ctx, c, *dest)
	if err != nil {
		return fail(err)
	}
	moved, err := sqstransport.Redrive(ctx, c, srcURL, dstURL, *max)
	fmt.Fprintf(stdout, "moved %d messages from %s to %s\n", moved, queueName(srcURL), queueName(dstURL))
	if err != nil {
		return fail(err)
	}
	return 0
}

func queueName(nameOrURL string) string { return nameOrURL[strings.LastIndex(nameOrURL, "/")+1:] }

// resolve turns a queue name into its URL; URLs are kept as they are.
func resolve(ctx context.Context, c *sqs.Client, nameOrURL string) (string, error) {
	if strings.Contains(nameOrURL, "://") {
		return nameOrURL, nil
	}
	out, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &nameOrURL})
	if err != nil {
		return "", fmt.Errorf("queue %s: %w", nameOrURL, err)
	}
	return *out.QueueUrl, nil
}
