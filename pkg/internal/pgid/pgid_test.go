package pgid_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/effectively-once/payments-cashback/pkg/internal/pgid"
)

// The native forms encode and decode to exactly what uuid.UUID's own
// (driver.Valuer, sql.Scanner) path gives, in both wire formats.
func TestNativeFormsAreTheValuerForms(t *testing.T) {
	m := pgtype.NewMap()
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Nil}
	same := func(oid uint32, format int16, native, valuer any) []byte {
		t.Helper()
		want, err := m.Encode(oid, format, valuer, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := m.Encode(oid, format, native, nil)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("format %d: %T encodes %x, %T %x", format, native, got, valuer, want)
		}
		return got
	}
	for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
		for _, id := range ids {
			got := same(pgtype.UUIDOID, format, pgid.Of(id), id)
			var back uuid.UUID
			if err := m.Scan(pgtype.UUIDOID, format, got, pgid.Scan(&back)); err != nil || back != id {
				t.Fatalf("format %d: Scan gave %s, %v; want %s", format, back, err, id)
			}
		}
		same(pgtype.UUIDArrayOID, format, pgid.All(ids), ids)
	}
}

func BenchmarkEncode(b *testing.B) {
	m := pgtype.NewMap()
	ids := make([]uuid.UUID, 100)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	buf := make([]byte, 0, 4096)
	b.Run("uuid.UUID", func(b *testing.B) {
		for b.Loop() {
			_, _ = m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, ids[0], buf[:0])
		}
	})
	b.Run("Of", func(b *testing.B) {
		for b.Loop() {
			_, _ = m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, pgid.Of(ids[0]), buf[:0])
		}
	})
	b.Run("[]uuid.UUID/100", func(b *testing.B) {
		for b.Loop() {
			_, _ = m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, ids, buf[:0])
		}
	})
	b.Run("All/100", func(b *testing.B) {
		for b.Loop() {
			_, _ = m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, pgid.All(ids), buf[:0])
		}
	})
}
