// Package sms is the notifications service's view of an SMS provider: the
// Provider interface, the optional Lookup capability, how errors are
// classified, and an HTTP client for providers that speak the dev
// provider's API (services/notifications/smsprovider).
//
// Every send carries an idempotency key derived from the event
// ("sms:<event_id>"): a provider that honours it delivers a message once
// however often it is asked, which is what makes a resend after an
// unknown outcome safe.
package sms

import (
	"context"
	"errors"
	"fmt"
)

// Message is one SMS to send.
type Message struct {
	IdempotencyKey string // "sms:<event_id>"
	To             string
	Body           string
}

// Receipt is the provider's answer to an accepted message.
type Receipt struct {
	MessageID string
}

// Provider sends SMS. Send returns the receipt of an accepted message, or
// an error classified by Classify: Rejected (will never be accepted),
// Retryable (known not accepted; try again later) or Unknown (it may or
// may not have been accepted: a timeout, a connection lost mid-request).
// The sender logs the error and stores its text in the row, so it must
// not carry a phone number whole: HTTPProvider masks any in the
// provider's answer (contract.MaskPhones).
type Provider interface {
	Send(ctx context.Context, m Message) (Receipt, error)
}

// Looker is the optional capability of a provider that can say whether it
// accepted a message under an idempotency key. The sender's reconciler
// uses it for rows whose outcome is unknown; providers without it get the
// per-kind resend/skip policy instead.
type Looker interface {
	// Lookup returns the receipt of the message accepted under key, or
	// found = false if the provider never accepted one.
	Lookup(ctx context.Context, key string) (r Receipt, found bool, err error)
}

// Pinger is the optional capability of a provider that can be asked
// whether it answers at all, whatever the message: the probe of the
// sender's outage gate (sender.Config.Gate), so that a provider outage
// holds messages back instead of using up their attempts.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Class is what a send error means for the message.
type Class int

const (
	// Retryable: the provider did not accept it (429, 409, connection
	// refused). Sending again later, with the same key, is safe.
	Retryable Class = iota
	// Rejected: the provider refused it for good (invalid number, bad
	// request). Sending again would fail the same way.
	Rejected
	// Unknown: the request may have been accepted (timeout, connection
	// lost after the request was written, a 5xx). Reconcile before resending.
	Unknown
)

func (c Class) String() string {
	switch c {
	case Rejected:
		return "rejected"
	case Unknown:
		return "unknown"
	}
	return "retryable"
}

// Error is a classified provider error.
// ErrCredential is in the chain of a Send error that the provider
// answered 401 or 403: it refused this service's credential before any
// work, so the message itself is not at fault (Class Retryable).
var ErrCredential = errors.New("the provider refused this service's credential")

type Error struct {
	Class Class
	Err   error
}

func (e *Error) Error() string { return fmt.Sprintf("sms provider (%s): %v", e.Class, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// Classify returns the class of a Send error. Errors that are not an
// *Error count as Unknown: without knowing better, the message may have
// been accepted.
func Classify(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return Unknown
}

// WithoutLookup hides p's Lookup capability (configuration
// SMS_PROVIDER_LOOKUP=false, and tests of the resend/skip policy).
func WithoutLookup(p Provider) Provider { return sendOnly{p} }

type sendOnly struct{ p Provider }

func (s sendOnly) Send(ctx context.Context, m Message) (Receipt, error) { return s.p.Send(ctx, m) }
