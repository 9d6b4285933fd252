// Package migrate applies embedded SQL migrations with goose.
//
// Every package that owns tables (pkg/outbox, pkg/idempotent, each service)
// ships its migrations as an embed.FS and keeps its own goose version table,
// so a service that copies pkg/outbox gets the outbox schema with it and the
// version numbers of the pieces never collide. A PostgreSQL advisory lock
// serialises replicas that start at the same time.
package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// Up applies every migration in fsys (files named NNNNN_name.sql at its root)
// that versionTable does not record yet. It is safe to call from several
// processes at once: the second waits for the first and then finds nothing
// to do.
func Up(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, versionTable string) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(versionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.Default()),
	)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", versionTable, err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", versionTable, err)
	}
	return nil
}
