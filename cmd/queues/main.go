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
	"log"
	"os"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// queues are the source queues of the design; each gets a "-dlq" sibling.
var queues = []string{"payments-events", "rewards-events"}

func main() {
	prefix := flag.String("prefix", "", "prepended to every queue name (test isolation)")
	maxReceive := flag.Int("max-receive", 5, "receives before SQS moves a message to the DLQ")
	visibility := flag.Duration("visibility", 30*time.Second, "visibility timeout of the source queues")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("queues: ")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := sqstransport.NewClient(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, q := range queues {
		url, dlq, err := sqstransport.EnsureQueue(ctx, c, *prefix+q, *maxReceive, *visibility)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(os.Stdout, "%s\n%s\n", url, dlq)
	}
}
