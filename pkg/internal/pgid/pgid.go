// Package pgid hands uuid.UUID values to pgx in the form pgx encodes
// natively.
//
// A uuid.UUID is a driver.Valuer, and pgx honours that before it looks at
// the type underneath: it calls Value (a 36-byte string), fails to encode
// the string as a binary uuid, parses it back and encodes the result, at
// about 20 allocations for 16 bytes. A [16]byte is encoded directly: for
// one id 2.2 µs → 0.1 µs, for an array of 100 ids 266 µs → 10 µs. The
// stored values are the same. The packages' hot statements pass ids
// through here; a uuid.UUID is assignable to [16]byte, so a slice built
// as [][16]byte needs no conversion of its elements either.
package pgid

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Of is id for a statement parameter.
func Of(id uuid.UUID) [16]byte { return id }

// All is ids for an array parameter ($1::uuid[]).
func All(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// Scan is a destination for a uuid column that fills *id.
func Scan(id *uuid.UUID) *[16]byte { return (*[16]byte)(id) }

// Collect reads rows of one uuid column (a RETURNING id, say).
func Collect(rows pgx.Rows) ([]uuid.UUID, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (id uuid.UUID, err error) {
		return id, row.Scan(Scan(&id))
	})
}
