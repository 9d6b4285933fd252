// Package migrations holds the notifications service's own schema as
// embedded goose migrations (the inbox / dedupe tables come from
// pkg/idempotent with their own version table).
package migrations

import "embed"

// FS holds the NNNNN_name.sql files at its root.
//
//go:embed *.sql
var FS embed.FS

// VersionTable is the goose version table of this schema.
const VersionTable = "goose_db_version"
