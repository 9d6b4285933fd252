package idempotent

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// VersionTable is the goose version table of this package's schema.
const VersionTable = "idempotent_schema_version"

// Migrate creates or upgrades the tables this package owns
// (processed_messages, inbox) and the daily partitions of processed_messages
// for the default retention window. Call it at service start; it is safe to
// run from several replicas at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	sub, err := fsSub(migrations, "migrations")
	if err != nil {
		return err
	}
	if err := migrate.Up(ctx, pool, sub, VersionTable); err != nil {
		return err
	}
	_, err = EnsurePartitions(ctx, pool, DefaultRetention, DefaultPartitionsAhead)
	return err
}
