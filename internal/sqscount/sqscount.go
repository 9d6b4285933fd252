// Package sqscount instruments an SQS client to count its API calls, so
// benchmarks can report calls per message (SQS bills per request).
package sqscount

import (
	"context"
	"sync"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
)

// Client returns a copy of c that counts its calls per operation name
// ("ReceiveMessage", ...), and a function that reads a count.
func Client(c *sqs.Client) (*sqs.Client, func(op string) int64) {
	var mu sync.Mutex
	calls := map[string]int64{}
	cc := sqs.New(c.Options(), func(o *sqs.Options) {
		o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
			return st.Initialize.Add(middleware.InitializeMiddlewareFunc("count-calls",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					mu.Lock()
					calls[awsmiddleware.GetOperationName(ctx)]++
					mu.Unlock()
					return next.HandleInitialize(ctx, in)
				}), middleware.After)
		})
	})
	return cc, func(op string) int64 { mu.Lock(); defer mu.Unlock(); return calls[op] }
}
