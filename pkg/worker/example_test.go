package worker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/worker"
)

// A worker that drains a queue of jobs: a pass takes up to 10, says more is
// due when it took a full batch, and sleeps otherwise until a producer
// notifies it (or PollInterval, the fallback that alone keeps it correct).
func ExampleRun() {
	var queued, done atomic.Int64
	var wake worker.Signal
	ctx, stop := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		_ = worker.Run(ctx, worker.Config{Name: "example", PollInterval: time.Hour, Wake: &wake},
			func(ctx context.Context, _ int) (int, bool, error) {
				n := min(queued.Load()-done.Load(), 10)
				done.Add(n)
				if done.Load() == 25 {
					stop() // the example is over once all 25 are done
				}
				return int(n), n == 10, nil
			})
	}()
	queued.Store(25)
	wake.Notify() // a producer committed work: no need to wait an hour
	<-finished
	fmt.Println("done:", done.Load())
	// Output: done: 25
}
