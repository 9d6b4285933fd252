// Package outage tells an outage of a dependency (the database or the queue
// unreachable) from a failure of one message, and holds consumers back while
// the outage lasts.
//
// Why it matters: a consumer whose database is down fails every message
// fast. SQS shows each one again after its backoff and dead-letters it at
// maxReceiveCount, so a routine 30–60 s PostgreSQL restart would move the
// whole backlog to the DLQ. With a Gate, the first error that looks like an
// outage is confirmed by a probe (a ping of the database); if the probe fails
// too, the gate closes: the consumer stops receiving, holds the messages it
// already has (their visibility kept extended, their receive count
// unchanged), reports not-ready, and probes with backoff until the
// dependency answers. Then it reopens and the held messages are handled
// again.
//
// What it does not do: it never decides that a message is poison. An error
// that the probe does not confirm (the database answers the ping) is the
// message's own, and takes the transport's ordinary path: redelivery with
// backoff, then the DLQ after maxReceiveCount.
package outage

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unavailable reports whether err looks like a dependency that could not be
// reached or did not answer, rather than a verdict on the request: a
// refused, reset or closed connection (pgconn.ErrConnClosed included), a dial or I/O timeout, a deadline
// that ran out (a pool acquire or a query on a hung connection), a
// PostgreSQL connection exception (class 08), shutdown or start-up (57P01,
// 57P02, 57P03) or too_many_connections (53300), and a server error or
// throttling from an HTTP API (status 5xx or 429, as the AWS SDK reports it).
//
// It is a hint, not a proof: a deadline can also run out on a slow query of
// one message. Gate.Suspect therefore confirms it with a probe. context.Canceled
// (a shutdown) is never an outage.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, pgconn.ErrConnClosed) || pgconn.Timeout(err) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true // *net.OpError, DNS errors, timeouts: the network, not the message
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		code := pe.Code
		return len(code) == 5 && (code[:2] == "08" || code == "57P01" || code == "57P02" || code == "57P03" || code == "53300")
	}
	var hs interface{ HTTPStatusCode() int } // the AWS SDK's response errors
	if errors.As(err, &hs) {
		c := hs.HTTPStatusCode()
		return c >= 500 || c == 429
	}
	// A pgx error that says nothing was sent (the connection was found
	// broken before use) is the connection's fault too. What is left is
	// the request's own business.
	return pgconn.SafeToRetry(err)
}
