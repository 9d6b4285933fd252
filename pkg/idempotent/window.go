package idempotent

import "time"

// Expired reports whether m is older than the dedupe window retention at
// now, judged by its occurred_at and by the time in its UUIDv7 id. Every
// store refuses such a copy (Expired) because its key may have been
// forgotten; stores outside this package use it to draw the same line.
func (m Message) Expired(now time.Time, retention time.Duration) bool {
	return beyondWindow(m.EventID, m.OccurredAt, now, retention)
}
