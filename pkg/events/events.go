// Package events defines the envelope every message on the wire carries, and
// the strict decoder that turns an SQS body back into one.
//
// The envelope's EventID is the dedupe key for every consumer: it is assigned
// once by the producer (it equals the outbox row id) and survives relay
// resends, visibility-timeout redeliveries and DLQ redrives unchanged, unlike
// the SQS MessageId. Event ids are UUIDv7, so they are time-ordered: dedupe
// indexes stay append-mostly and processed_messages can be partitioned by the
// id's own timestamp.
package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// MaxBodyBytes is the largest body SQS accepts (256 KiB); Decode refuses
// anything bigger before parsing it.
const MaxBodyBytes = 256 * 1024

// MaxAggregateIDBytes is the longest aggregate_id accepted: it is a key in
// the consumers' indexes, and PostgreSQL refuses an index entry of much
// more than 2 KB.
const MaxAggregateIDBytes = 1024

// Envelope is the JSON body of every SQS message.
type Envelope struct {
	EventID          uuid.UUID       `json:"event_id"`
	EventType        string          `json:"event_type"`
	AggregateID      string          `json:"aggregate_id"`
	AggregateVersion int64           `json:"aggregate_version"`
	OccurredAt       time.Time       `json:"occurred_at"`
	Payload          json.RawMessage `json:"payload"`
}

// New builds an envelope with a fresh UUIDv7 event id and occurred_at = now
// (UTC, microsecond precision so it survives a PostgreSQL round trip
// unchanged). payload is marshalled to JSON and must encode as an object.
func New(eventType, aggregateID string, aggregateVersion int64, payload any) (Envelope, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Envelope{}, fmt.Errorf("events: new event id: %w", err)
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return Envelope{}, fmt.Errorf("events: marshal payload: %w", err)
	}
	e := Envelope{
		EventID:          id,
		EventType:        eventType,
		AggregateID:      aggregateID,
		AggregateVersion: aggregateVersion,
		OccurredAt:       time.Now().UTC().Truncate(time.Microsecond),
		Payload:          raw,
	}
	if err := e.Validate(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}

// DecodeError says which field of a body was wrong and why. Decode returns
// it for every malformed input, so callers can park the message with a
// reason a human can act on.
type DecodeError struct {
	Field  string // JSON field name, or "body" for the document as a whole
	Reason string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("events: invalid %s: %s", e.Field, e.Reason)
}

// IsDecodeError reports whether err (or anything it wraps) is a *DecodeError.
func IsDecodeError(err error) bool {
	var de *DecodeError
	return errors.As(err, &de)
}

// wire mirrors Envelope with every field optional, so that Decode can tell
// "missing" from "zero" and name the field in its error.
type wire struct {
	EventID          *string         `json:"event_id"`
	EventType        *string         `json:"event_type"`
	AggregateID      *string         `json:"aggregate_id"`
	AggregateVersion *int64          `json:"aggregate_version"`
	OccurredAt       *string         `json:"occurred_at"`
	Payload          json.RawMessage `json:"payload"`
}

// Decode parses and validates an SQS body. It rejects, with a *DecodeError
// naming the field: bodies over MaxBodyBytes or not UTF-8, malformed JSON
// or anything after it, a top-level field that is unknown, repeated or
// spelled in another case (encoding/json alone would match "EVENT_ID" to
// event_id), an event_id that is not a UUIDv7 in its canonical
// 8-4-4-4-12 form, what Validate refuses, and an occurred_at that is not
// an RFC 3339 timestamp with at most nanoseconds. It does not judge the
// event type: which types a consumer accepts is the consumer's business.
func Decode(body []byte) (Envelope, error) {
	if len(body) > MaxBodyBytes {
		return Envelope{}, &DecodeError{"body", fmt.Sprintf("%d bytes exceeds the %d byte limit", len(body), MaxBodyBytes)}
	}
	if !utf8.Valid(body) {
		// encoding/json would quietly turn the bad bytes into U+FFFD.
		return Envelope{}, &DecodeError{"body", "not valid UTF-8"}
	}
	if name, reason := checkNames(body); reason != "" {
		// encoding/json would keep the last of two, or take another
		// case's: which event_id is meant?
		return Envelope{}, &DecodeError{name, reason}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var w wire
	if err := dec.Decode(&w); err != nil {
		return Envelope{}, wireError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		// More() is false before a stray '}' or ']' too.
		return Envelope{}, &DecodeError{"body", "trailing data after the JSON object"}
	}
	var e Envelope
	if w.EventID == nil {
		return Envelope{}, &DecodeError{"event_id", "missing"}
	}
	// uuid.Parse also takes the urn:uuid:, braced and undashed forms: one
	// id, several spellings, of which a consumer reading the body as text
	// would see only one.
	id, err := uuid.Parse(*w.EventID)
	if err != nil || len(*w.EventID) != 36 {
		return Envelope{}, &DecodeError{"event_id", "not a UUID in its canonical 8-4-4-4-12 form"}
	}
	e.EventID = id
	if w.EventType == nil {
		return Envelope{}, &DecodeError{"event_type", "missing"}
	}
	e.EventType = *w.EventType
	if w.AggregateID == nil {
		return Envelope{}, &DecodeError{"aggregate_id", "missing"}
	}
	e.AggregateID = *w.AggregateID
	if w.AggregateVersion == nil {
		return Envelope{}, &DecodeError{"aggregate_version", "missing"}
	}
	e.AggregateVersion = *w.AggregateVersion
	if w.OccurredAt == nil {
		return Envelope{}, &DecodeError{"occurred_at", "missing"}
	}
	t, err := time.Parse(time.RFC3339Nano, *w.OccurredAt)
	if err != nil || !strictRFC3339(*w.OccurredAt) {
		return Envelope{}, &DecodeError{"occurred_at", "not an RFC 3339 timestamp (at most nine fraction digits, after a '.')"}
	}
	e.OccurredAt = t.UTC()
	e.Payload = w.Payload
	if err := e.Validate(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}

// wireNames are the envelope's top-level names, as written on the wire.
var wireNames = [...]string{"event_id", "event_type", "aggregate_id", "aggregate_version", "occurred_at", "payload"}

// checkNames returns the first top-level name of body that is not one of
// wireNames exactly, or is one seen before, and why; "" for a body whose
// names are all right or that is not an object (the decoder then says
// what is wrong with it).
func checkNames(body []byte) (name, reason string) {
	var seen uint8
	visit := func(n string) bool {
		i := slices.Index(wireNames[:], n)
		switch {
		case i < 0:
			name, reason = n, "unknown top-level field (names are case-sensitive)"
		case seen&(1<<i) != 0:
			name, reason = n, "appears more than once"
		default:
			seen |= 1 << i
			return false
		}
		return true
	}
	if scanNames(body, visit) {
		return name, reason
	}
	seen, name, reason = 0, "", ""
	for _, n := range namesByTokens(body) {
		if visit(n) {
			break
		}
	}
	return name, reason
}

// DuplicateField reports the first top-level field name that appears more
// than once in the JSON object body (encoding/json silently keeps the last
// value). It reports nothing for a body that is not a well-formed object.
//
// Every message is checked, so the common case is a single pass over the
// bytes that allocates only for the names; a name seen twice (or an
// escaped name or one that is not UTF-8, which only a decoder can compare)
// is confirmed by encoding/json's tokenizer, whose answer is the one
// returned.
func DuplicateField(body []byte) (string, bool) {
	// Envelopes and request bodies have a handful of fields, compared in a
	// slice; a body with many (hostile, say) moves to a map, so the scan
	// stays linear.
	var seen []string
	var many map[string]bool
	repeated := false
	plain := scanNames(body, func(name string) bool {
		if many != nil {
			repeated = many[name]
			many[name] = true
			return repeated
		}
		if repeated = slices.Contains(seen, name); repeated {
			return true
		}
		if seen = append(seen, name); len(seen) > 16 {
			many = make(map[string]bool, 2*len(seen))
			for _, n := range seen {
				many[n] = true
			}
		}
		return false
	})
	if plain && !repeated {
		return "", false
	}
	return duplicateFieldByTokens(body)
}

// scanNames calls visit with each top-level name of the JSON object b, as
// written, until visit returns true. It returns false, having stopped,
// at a name with an escape or bytes that are not UTF-8 (decoded as U+FFFD,
// so two different ones are one name): only a decoder reads those as
// encoding/json does. What it cannot parse ends the scan (true): the
// decoder rejects the body as malformed.
func scanNames(b []byte, visit func(name string) (stop bool)) (plain bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return true
	}
	for i++; ; {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] == '}' {
			return true
		}
		if b[i] == ',' {
			i = skipSpace(b, i+1)
		}
		if i >= len(b) || b[i] != '"' {
			return true
		}
		end, escaped := stringEnd(b, i)
		if end < 0 {
			return true
		}
		if escaped || !utf8.Valid(b[i+1:end-1]) {
			return false
		}
		if visit(string(b[i+1 : end-1])) {
			return true
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return true
		}
		if i = valueEnd(b, skipSpace(b, i+1)); i < 0 {
			return true
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string starting at b[i] ('"'),
// and whether it holds an escape; -1 if it does not end.
func stringEnd(b []byte, i int) (int, bool) {
	escaped := false
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, false
}

// valueEnd returns the index of the ',' or '}' that ends the JSON value
// starting at b[i], or -1. Nested objects and arrays are skipped by depth,
// strings by their quotes; what is inside is not checked (Decode does).
func valueEnd(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			end, _ := stringEnd(b, i)
			if end < 0 {
				return -1
			}
			i = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
		case ',':
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// duplicateFieldByTokens is DuplicateField by encoding/json's tokenizer.
func duplicateFieldByTokens(body []byte) (string, bool) {
	seen := map[string]bool{}
	for _, name := range namesByTokens(body) {
		if seen[name] {
			return name, true
		}
		seen[name] = true
	}
	return "", false
}

// namesByTokens returns the top-level names of the JSON object body as
// encoding/json's tokenizer decodes them, up to the first syntax error.
func namesByTokens(body []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return names
		}
		name, _ := tok.(string)
		names = append(names, name)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return names
		}
	}
	return names
}

func wireError(err error) error {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) && ute.Field != "" {
		return &DecodeError{ute.Field, "wrong JSON type " + ute.Value}
	}
	msg := err.Error()
	const unknown = "json: unknown field "
	if len(msg) > len(unknown) && msg[:len(unknown)] == unknown {
		return &DecodeError{msg[len(unknown)+1 : len(msg)-1], "unknown top-level field"}
	}
	return &DecodeError{"body", "malformed JSON: " + msg}
}

// Validate checks the invariants Decode enforces; producers call it (New
// does) so that nothing undecodable is ever written to an outbox, and
// nothing PostgreSQL cannot store reaches a consumer's inbox as a
// failure that looks transient: text that is not UTF-8, a NUL in the
// aggregate id, an aggregate id over MaxAggregateIDBytes, a payload
// escape jsonb refuses (\u0000, a lone UTF-16 surrogate). It also
// refuses an occurred_at whose year, as written or in UTC, is outside
// 0..9999: JSON (time.Time.MarshalJSON) cannot carry it, so the envelope
// could be stored but never sent.
func (e Envelope) Validate() error {
	switch {
	case e.EventID == uuid.Nil:
		return &DecodeError{"event_id", "missing"}
	case e.EventID.Version() != 7 || e.EventID.Variant() != uuid.RFC4122:
		return &DecodeError{"event_id", fmt.Sprintf("must be a UUIDv7, got version %d of variant %s", e.EventID.Version(), e.EventID.Variant())}
	case e.EventType == "":
		return &DecodeError{"event_type", "empty"}
	case !utf8.ValidString(e.EventType):
		return &DecodeError{"event_type", "not valid UTF-8"}
	case strings.IndexFunc(e.EventType, func(r rune) bool { return !QueueSafe(r) }) >= 0:
		// It is a message attribute too, where no JSON escape helps.
		return &DecodeError{"event_type", "holds a character a queue may refuse (a control character, U+FFFE or U+FFFF, or one above U+FFFF)"}
	case e.AggregateID == "":
		return &DecodeError{"aggregate_id", "empty"}
	case !utf8.ValidString(e.AggregateID):
		return &DecodeError{"aggregate_id", "not valid UTF-8"}
	case strings.IndexByte(e.AggregateID, 0) >= 0:
		return &DecodeError{"aggregate_id", "holds a NUL, which PostgreSQL cannot store in text"}
	case len(e.AggregateID) > MaxAggregateIDBytes:
		return &DecodeError{"aggregate_id", fmt.Sprintf("%d bytes, more than the %d allowed", len(e.AggregateID), MaxAggregateIDBytes)}
	case e.AggregateVersion < 0:
		return &DecodeError{"aggregate_version", "negative"}
	case e.OccurredAt.IsZero():
		return &DecodeError{"occurred_at", "missing"}
	case !encodableYear(e.OccurredAt.Year()) || !encodableYear(e.OccurredAt.UTC().Year()):
		// json refuses it (time.Time.MarshalJSON), as written or in UTC,
		// where the relay encodes a stored row: a row no relay could send.
		return &DecodeError{"occurred_at", fmt.Sprintf("year of %s outside 0..9999, which JSON cannot carry", e.OccurredAt.Format(time.RFC3339Nano))}
	}
	p := bytes.TrimSpace(e.Payload)
	if len(p) == 0 || p[0] != '{' || !json.Valid(p) {
		return &DecodeError{"payload", "must be a JSON object"}
	}
	if !utf8.Valid(p) {
		// json.Valid takes them; encoding/json would turn them into U+FFFD.
		return &DecodeError{"payload", "not valid UTF-8"}
	}
	if why := jsonbRefuses(p); why != "" {
		return &DecodeError{"payload", why}
	}
	return nil
}

// jsonbRefuses says why PostgreSQL's jsonb would refuse the valid JSON p,
// or "": it stores no \u0000 and no UTF-16 surrogate that is not half of
// a pair.
func jsonbRefuses(p []byte) string {
	low := func(r rune) bool { return r >= 0xDC00 && r <= 0xDFFF }
	for i := 0; i < len(p); i++ {
		j := bytes.IndexByte(p[i:], '\\')
		if j < 0 {
			return ""
		}
		// Backslashes occur only in strings, each starting an escape.
		if i += j + 1; p[i] != 'u' {
			continue
		}
		r := hex4(p[i+1:])
		i += 4
		switch {
		case r == 0:
			return "holds \\u0000, which PostgreSQL cannot store in jsonb"
		case low(r):
			return "holds a UTF-16 low surrogate with no high one before it, which PostgreSQL cannot store in jsonb"
		case r >= 0xD800 && r <= 0xDBFF:
			if i+6 >= len(p) || p[i+1] != '\\' || p[i+2] != 'u' || !low(hex4(p[i+3:])) {
				return "holds a UTF-16 high surrogate with no low one after it, which PostgreSQL cannot store in jsonb"
			}
			i += 6
		}
	}
	return ""
}

// hex4 is the value of the four hex digits that begin b (valid JSON has
// them after every \u).
func hex4(b []byte) rune {
	var d [2]byte
	_, _ = hex.Decode(d[:], b[:4])
	return rune(d[0])<<8 | rune(d[1])
}

// strictRFC3339 reports whether s, which time.Parse took as RFC 3339, has
// exactly the form RFC 3339 gives a timestamp: '.' before the fraction
// (Go also takes ','), at most nine fraction digits (Go would drop the
// rest) and an offset of at most 23:59.
func strictRFC3339(s string) bool {
	i := len("2006-01-02T15:04:05")
	if len(s) <= i {
		return false
	}
	if s[i] == '.' {
		j := i + 1
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i+1 || j-i-1 > 9 {
			return false
		}
		i = j
	}
	switch rest := s[i:]; {
	case rest == "Z":
		return true
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		return rest[1] < '2' || (rest[1] == '2' && rest[2] <= '3')
	}
	return false
}

// encodableYear reports whether time.Time.MarshalJSON encodes a time of
// year y (RFC 3339 has four digits for it).
func encodableYear(y int) bool { return y >= 0 && y <= 9999 }

// Marshal encodes the envelope as the wire body.
func (e Envelope) Marshal() ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return e.AppendJSON(nil)
}

// Hash is a digest of everything in the envelope but its id. Consumers store
// it beside the dedupe key: a later copy with the same event_id and a
// different Hash is a conflict (a buggy producer reusing an id), not a
// duplicate. The payload is canonicalised first (object keys sorted,
// whitespace dropped, numbers kept digit for digit), so the same JSON with
// its keys reordered or respaced, as a jsonb column does, hashes the same;
// a number spelled another way (1e2 for 100, which jsonb also rewrites)
// does not, so hash copies as sent, not as read back from jsonb.
func (e Envelope) Hash() []byte {
	h := sha256.New()
	var n [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte(e.EventType))
	field([]byte(e.AggregateID))
	binary.BigEndian.PutUint64(n[:], uint64(e.AggregateVersion))
	h.Write(n[:])
	field([]byte(e.OccurredAt.UTC().Format(time.RFC3339Nano)))
	field(canonical(e.Payload))
	return h.Sum(nil)
}

// canonical re-encodes JSON with sorted keys (encoding/json sorts map keys)
// and json.Number for numbers; invalid JSON is hashed as it is.
func canonical(raw []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}

// IDTime is the creation time encoded in a UUIDv7 event id (millisecond
// precision). processed_messages is partitioned by it.
func IDTime(id uuid.UUID) time.Time {
	sec, nsec := id.Time().UnixTime()
	return time.Unix(sec, nsec).UTC()
}
