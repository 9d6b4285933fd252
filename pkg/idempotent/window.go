package idempotent

import (
	"fmt"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/events"
)

// Expired reports whether m is older than the dedupe window retention at
// now, judged by its occurred_at and by the time in its UUIDv7 id. Every
// store refuses such a copy (Expired) because its key may have been
// forgotten; stores outside this package use it to draw the same line.
func (m Message) Expired(now time.Time, retention time.Duration) bool {
	return beyondWindow(m.EventID, m.OccurredAt, now, retention)
}

// Ahead refuses, with the permanent ErrAhead and by how much, a Message
// whose id was minted more than MaxFutureSkew after now: no partition is
// kept ready for it, and its producer's clock is wrong. Stores outside
// this package use it to refuse what Consumer refuses.
func (m Message) Ahead(now time.Time) error {
	if skew := events.IDTime(m.EventID).Sub(now); skew > MaxFutureSkew {
		return fmt.Errorf("%w: event id %s was minted %v ahead of this consumer's clock, more than the %v tolerated "+
			"(is the producer's clock ahead?)", ErrAhead, m.EventID, skew.Round(time.Second), MaxFutureSkew)
	}
	return nil
}

// AcceptedUntil is the last instant a copy of m is inside the dedupe
// window retention (Expired is false until then): the earlier of its
// occurred_at and its id's time, plus retention. A store that forgets
// keys by time must keep m's at least this long, which for an event from
// a clock ahead is longer than retention from now.
func (m Message) AcceptedUntil(retention time.Duration) time.Time {
	at := m.OccurredAt
	if id := events.IDTime(m.EventID); m.EventID.Version() == 7 && id.Before(at) {
		at = id
	}
	return at.Add(retention)
}

// Validate refuses, with ErrInvalidMessage and the reason, a Message no
// store can keep as a key: an EventID that is not a UUIDv7 (keys are
// partitioned, and expire, by the time in the id) or no Hash to compare a
// later copy with. MessageOf of a decoded envelope is always valid.
func (m Message) Validate() error {
	switch {
	case m.EventID.Version() != 7:
		return fmt.Errorf("%w: event id %s is not a UUIDv7 (version %d)", ErrInvalidMessage, m.EventID, m.EventID.Version())
	case len(m.Hash) == 0:
		return fmt.Errorf("%w: event %s has no hash (build the Message with MessageOf)", ErrInvalidMessage, m.EventID)
	}
	return nil
}

// ClockSkewMargin is how long after the dedupe window closes, by its own
// clock, the Maintainer keeps a key: it drops a processed_messages
// partition, and deletes a DONE inbox row, only once the key is older than
// Retention + ClockSkewMargin. A copy is refused as too old (Expired) by
// the clock of the replica that receives it, and the two hosts' clocks
// differ: forgetting exactly at the window let a replica whose clock lags
// the maintainer's accept a copy whose key was already gone, and apply it
// again (and let its Migrate recreate a dropped partition, empty). With
// the margin, clocks that disagree by less than a day cannot open that gap;
// the keys kept cost one more day of storage. The window itself (what is
// refused) is unchanged, so ValidateRetention's day over the queue
// retention still holds.
const ClockSkewMargin = day
