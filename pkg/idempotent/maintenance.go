package idempotent

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultMaintenanceInterval is how often MaintainPartitions runs: daily
// partitions only need a pass a day, hourly keeps a missed pass cheap.
const DefaultMaintenanceInterval = time.Hour

// MaintainPartitions keeps processed_messages' daily partitions in step
// with the retention window until ctx is cancelled: it creates the days
// ahead (EnsurePartitions with DefaultPartitionsAhead) and drops the days
// wholly older than retention (DropExpiredPartitions), once at start and
// then every interval (<= 0: DefaultMaintenanceInterval). A failed pass is
// logged and retried at the next tick: with DefaultPartitionsAhead days of
// partitions ahead, a few missed passes break nothing. It returns nil on
// cancellation, so it fits service.Task.Run. Use the same retention as the
// Consumer's WithRetention.
func MaintainPartitions(ctx context.Context, pool *pgxpool.Pool, retention, interval time.Duration, log *slog.Logger) error {
	if interval <= 0 {
		interval = DefaultMaintenanceInterval
	}
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		created, err := EnsurePartitions(ctx, pool, retention, DefaultPartitionsAhead)
		if err != nil && ctx.Err() == nil {
			log.Error("processed_messages: creating partitions failed", "error", err)
		}
		dropped, err := DropExpiredPartitions(ctx, pool, retention)
		if err != nil && ctx.Err() == nil {
			log.Error("processed_messages: dropping expired partitions failed", "error", err)
		}
		if len(created) > 0 || len(dropped) > 0 {
			log.Info("processed_messages partitions maintained", "created", created, "dropped", dropped, "retention", retention)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
