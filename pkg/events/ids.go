package events

import "regexp"

// MaxIDLength bounds the identifiers events carry (payment and user ids).
const MaxIDLength = 128

var idShape = regexp.MustCompile(`^[A-Za-z0-9_.:@-]{1,128}$`)

// ValidID reports whether s has the shape of an identifier in an event
// (pay_…, u_17): 1 to MaxIDLength ASCII letters, digits and _ . : @ -.
// An allowlist, so producers and consumers agree on what an id can hold:
// no spaces, quotes, control, invisible or bidi characters, no homoglyphs,
// no U+FFFD standing in for bytes that were not UTF-8.
func ValidID(s string) bool { return idShape.MatchString(s) }
