// Command queues creates the system's SQS queues and their dead-letter
// queues, idempotently: payments-events (+ payments-events-dlq) and
// rewards-events (+ rewards-events-dlq), each redriving to its DLQ after
// -max-receive receives.
//
// The endpoint comes from the standard AWS_ENDPOINT_URL (fauxqs or
// LocalStack locally; unset means real AWS). scripts/stack.sh infra-up runs
// it; it is safe to run again at any time.
//
//	go run ./cmd/queues [-prefix test-] [-max-receive 5] [-visibility 30s]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// queues are the source queues of the design; each gets a "-dlq" sibling.
var queues = []string{"payments-events", "rewards-events"}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command with its arguments; it returns the exit status: 2 for
// bad arguments, before any queue is touched (EnsureQueue sets what it is
// given on queues that exist, so a flag lost behind a stray word would
// reset a live queue to the defaults), 1 for a failure.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("queues", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prefix := fs.String("prefix", "", "prepended to every queue name (test isolation)")
	maxReceive := fs.Int("max-receive", 5, "receives before SQS moves a message to the DLQ")
	visibility := fs.Duration("visibility", 30*time.Second, "visibility timeout of the source queues")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "queues: unexpected argument %q: every setting is a flag, and none after it was read\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	c, err := sqstransport.NewClient(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "queues:", err)
		return 1
	}
	for _, q := range queues {
		url, dlq, err := sqstransport.EnsureQueue(ctx, c, *prefix+q, *maxReceive, *visibility)
		if err != nil {
			fmt.Fprintln(stderr, "queues:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s\n%s\n", url, dlq)
	}
	return 0
}
