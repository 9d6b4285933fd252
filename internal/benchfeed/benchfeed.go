// Package benchfeed offers work to a pipeline under measurement, as fast
// as it goes or at a fixed rate; cmd/bench and bench/peers feed the
// library's pipelines and the peers' with it.
package benchfeed

import (
	"context"
	"sync"
	"time"
)

// Feed calls send(i) for every i in [0, n) from workers goroutines. With
// rate 0 they go as fast as they can; with rate > 0 item i is offered at
// start + i/rate, an open loop: a slow send delays no later offer, the
// items queue for the next free goroutine instead, so what is measured at
// a load under capacity is the pipeline's latency and not the pace of the
// feeder. It returns the first error, after the goroutines stopped.
func Feed(ctx context.Context, n int, rate float64, workers int, send func(i int) error) error {
	items := make(chan int, n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range items {
				if err := send(i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		})
	}
	start := time.Now()
	for i := range n {
		if rate > 0 {
			due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(d):
				}
			}
		}
		if ctx.Err() != nil {
			break
		}
		items <- i
	}
	close(items)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}
