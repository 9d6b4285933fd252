// Package migrations holds the rewards service's own schema as embedded
// goose migrations. The outbox and processed_messages tables come from
// pkg/outbox and pkg/idempotent, each with its own version table.
package migrations

import "embed"

// FS holds the NNNNN_name.sql files at its root.
//
//go:embed *.sql
var FS embed.FS

// VersionTable is the goose version table of this schema.
const VersionTable = "goose_db_version"
