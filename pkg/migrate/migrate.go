// Package migrate applies embedded SQL migrations with goose.
//
// Every package that owns tables (pkg/outbox, pkg/idempotent, each service)
// ships its migrations as an embed.FS and keeps its own goose version table,
// so a service that copies pkg/outbox gets the outbox schema with it and the
// version numbers of the pieces never collide. A PostgreSQL advisory lock
// serialises replicas that start at the same time.
//
// Each migration applied is logged to slog's default logger at Info.
package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// lockWait bounds the wait for another process's migrations; lockPoll is
// how often the lock is tried meanwhile. goose's default, 5 minutes, is
// shorter than a CREATE INDEX on a big table, and a replica that gave up
// would fail to start.
const (
	lockPoll = time.Second
	lockWait = time.Hour
)

// Up applies every migration in fsys (files named NNNNN_name.sql at its root)
// that versionTable does not record yet. It is safe to call from several
// processes at once: the second waits for the first, trying the lock each
// second, for up to an hour or until ctx ends, and then finds nothing to
// do. It connects with pool's connection settings, on connections of its
// own (the pool's AfterConnect and other hooks do not run on them).
func Up(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, versionTable string) error {
	// Connections of its own, closed after, rather than the pool's: a
	// migration's SET (search_path, a timeout) would otherwise stay on a
	// connection the application then gets back.
	db := stdlib.OpenDB(*pool.Config().ConnConfig.Copy())
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockTimeout(uint64(lockPoll/time.Second), uint64(lockWait/lockPoll)))
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(versionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", versionTable, err)
	}
	applied, err := p.Up(ctx)
	for _, r := range applied {
		if r.Error == nil {
			slog.InfoContext(ctx, "migration applied", "version_table", versionTable,
				"version", r.Source.Version, "file", r.Source.Path, "took", r.Duration)
		}
	}
	if err != nil {
		return fmt.Errorf("migrate %s: %w", versionTable, err)
	}
	return nil
}
