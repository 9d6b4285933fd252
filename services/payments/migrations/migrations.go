// Package migrations holds the payments schema and applies it together with
// the schemas of the library pieces the service uses.
package migrations

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/httpidem"
	"github.com/effectively-once/payments-cashback/pkg/migrate"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

//go:embed *.sql
var files embed.FS

// VersionTable is the goose version table of the payments schema.
const VersionTable = "goose_db_version"

// Up creates or upgrades every table of the payments database: payments
// (this package), outbox (pkg/outbox) and idempotency_keys (pkg/httpidem).
// Each keeps its own version table; all are safe to run from several
// replicas at once.
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrate.Up(ctx, pool, files, VersionTable); err != nil {
		return err
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	return httpidem.Migrate(ctx, pool)
}
