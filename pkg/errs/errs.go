// Package errs is the leaf every layer of the library shares, built on the
// standard library alone: the marker for errors that no retry can fix, the
// error a recovered panic is passed on as, and the JSON body of every HTTP
// error response. Copying any package of pkg/
// brings this one with it and nothing else.
package errs

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
)

// Permanent marks err as one that no redelivery or retry can fix: a
// subscriber parks such a message in its DLQ, an inbox processor marks the
// row FAILED, instead of trying again. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

type permanent struct{ error }

func (p permanent) Unwrap() error   { return p.error }
func (p permanent) Permanent() bool { return true }

// IsPermanent reports whether err, or an error it wraps, has a
// Permanent() bool method that returns true: errors made by Permanent, and
// any other type that opts in the same way (so a package can mark its own
// sentinel errors without importing this one).
func IsPermanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

// PanicError is a recovered panic passed on as an error: a library that
// recovers a panic in the caller's code (an idempotent Effect) returns one,
// so that the caller, and a transport above it, can tell it from an
// ordinary failure. Value is what was panicked with. A subscriber counts a
// message whose handler returns one (or wraps one) as panicking, towards
// its MaxPanics, just as if the panic had reached it. It is not permanent:
// a panic may be a bug that a redelivery, on a fixed replica, gets past.
type PanicError struct{ Value any }

func (p *PanicError) Error() string  { return fmt.Sprint(p.Value) }
func (p *PanicError) Panicked() bool { return true }

// Unwrap is the panic's value when it is an error (a runtime.Error, say).
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}

// IsPanic reports whether err, or an error it wraps, has a Panicked() bool
// method that returns true: a *PanicError, or any other type that opts in
// the same way.
func IsPanic(err error) bool {
	var p interface{ Panicked() bool }
	return errors.As(err, &p) && p.Panicked()
}

// Body is the JSON shape of every error response: a machine-readable code,
// the offending field when there is one, and a sentence for humans. It
// never carries internal error text.
type Body struct {
	Error Detail `json:"error"`
}

// Detail is the content of Body.
type Detail struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	// RequestID is set on 500s: the id to find the detail in the log by.
	RequestID string `json:"request_id,omitempty"`
}

// WriteJSON writes v as a JSON response with status. v is encoded before
// the status is written: a value that cannot be encoded (a time past
// year 9999, say) is answered 500 "internal", and logged, instead of the
// status with an empty body.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		slog.Error("response body cannot be encoded as JSON", "status", status, "error", err)
		status = http.StatusInternalServerError
		body, _ = json.Marshal(Body{Detail{Code: "internal", Message: "internal error"}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// Write writes a Body with status.
func Write(w http.ResponseWriter, status int, code, field, message string) {
	WriteJSON(w, status, Body{Detail{Code: code, Field: field, Message: message}})
}
