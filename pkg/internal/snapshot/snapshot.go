// Package snapshot caches the result of a read that is too costly to run on
// every metrics scrape: backlog gauges whose queries grow with the backlog.
package snapshot

import (
	"context"
	"sync"
	"time"
)

// Cache holds the last result of read for TTL. Concurrent Gets during a
// read wait for it instead of starting their own, and each read is bounded
// by Timeout, so however often /metrics is scraped the database sees at
// most one such query per TTL, none longer than Timeout. A failed read is
// cached too, so a struggling database is not asked again at every scrape.
type Cache[T any] struct {
	TTL, Timeout time.Duration
	read         func(context.Context) (T, error)

	mu  sync.Mutex
	at  time.Time
	v   T
	err error
}

// New returns a Cache of read.
func New[T any](ttl, timeout time.Duration, read func(context.Context) (T, error)) *Cache[T] {
	return &Cache[T]{TTL: ttl, Timeout: timeout, read: read}
}

// Get returns the cached result, reading it again once it is older than TTL.
func (c *Cache[T]) Get(ctx context.Context) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.TTL {
		return c.v, c.err
	}
	rctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	c.v, c.err = c.read(rctx)
	c.at = time.Now()
	return c.v, c.err
}
