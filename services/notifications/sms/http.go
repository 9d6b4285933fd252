package sms

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/effectively-once/payments-cashback/services/contract"
)

// HTTPProvider talks to an SMS provider over the dev provider's HTTP API,
// every request with the header Authorization: Bearer <apiKey>:
//
//	POST /v1/messages                     Idempotency-Key header, {"to","body"} → {"message_id",...}
//	GET  /v1/messages?idempotency_key=K   the message accepted under K, or 404
//
// It implements Provider, Looker and Pinger (GET /healthz).
type HTTPProvider struct {
	base, auth string
	client     *http.Client
}

// NewHTTPProvider returns a client of the provider at baseURL that sends
// apiKey as its credential (empty: none) and whose every request (connect,
// send, wait for the answer) is bounded by timeout (<= 0: 10 s). Keep it
// well under the sender's SENDING lease, so a live sender always gives up
// before the reconciler takes its row.
func NewHTTPProvider(baseURL, apiKey string, timeout time.Duration) *HTTPProvider {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	auth := ""
	if apiKey != "" {
		auth = "Bearer " + apiKey
	}
	return &HTTPProvider{
		base: strings.TrimRight(baseURL, "/"),
		auth: auth,
		// otelhttp: a client span per request, and the traceparent header,
		// so the provider's side of the call joins the payment's trace.
		client: &http.Client{Timeout: timeout, CheckRedirect: noRedirects, Transport: otelhttp.NewTransport(&http.Transport{
			DialContext:           (&net.Dialer{Timeout: min(timeout, 5*time.Second)}).DialContext,
			ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost:   16,
			IdleConnTimeout:       90 * time.Second,
		})},
	}
}

// noRedirects hands a 3xx back to the caller as the answer: a send
// redirected would reach another URL as a GET (301, 302, 303), whose
// answer says nothing of the message.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

type sendRequest struct {
	To   string `json:"to"`
	Body string `json:"body"`
}

type messageResponse struct {
	MessageID string `json:"message_id"`
}

// Send posts m with its idempotency key, exactly once: the HTTP client
// never resends it by itself (after a dropped connection, a redirect), so
// every copy the provider sees is one the sender chose to send. Any 2xx is
// accepted (its message id read; an answer without one is Unknown, for
// the lookup to settle); 409 and 429 are Retryable, as are 401 and 403
// (ErrCredential); any other 4xx is Rejected; a 5xx, 1xx or 3xx, a
// timeout or a connection lost after the request was written is Unknown.
func (p *HTTPProvider) Send(ctx context.Context, m Message) (Receipt, error) {
	if m.IdempotencyKey == "" {
		return Receipt{}, &Error{Rejected, errors.New("no idempotency key")}
	}
	body, err := json.Marshal(sendRequest{To: m.To, Body: m.Body})
	if err != nil {
		return Receipt{}, &Error{Rejected, err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return Receipt{}, &Error{Rejected, err}
	}
	req.Header.Set("Content-Type", "application/json")
	// Never replayed by net/http once written: the transport takes a POST
	// carrying the canonical "Idempotency-Key" header as replayable, and
	// would send it again by itself on a new connection when a reused one
	// drops after the request was written. The provider may have accepted
	// the first copy, and one that ignores keys would deliver twice, so a
	// dropped connection must reach the sender as an unknown outcome: the
	// kind's policy (or a lookup) decides whether to send again. Set under
	// its lower-case name, the header is the same to the provider (names
	// are case-insensitive) but not to that check; the transport still
	// retries a request of which nothing was written, which is safe.
	req.Header["idempotency-key"] = []string{m.IdempotencyKey}
	resp, err := p.do(req)
	if err != nil {
		return Receipt{}, transportError(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Receipt{}, &Error{Unknown, fmt.Errorf("reading the answer: %w", err)}
	}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		// Every 2xx accepts it: 201 created, 200 a replay of the key, 202
		// queued for delivery (what many SMS APIs answer).
		var mr messageResponse
		if err := json.Unmarshal(raw, &mr); err != nil || mr.MessageID == "" {
			// Accepted, but we cannot read the id: the lookup will.
			return Receipt{}, &Error{Unknown, fmt.Errorf("accepted with an unreadable answer %q", answerText(raw))}
		}
		return Receipt{MessageID: mr.MessageID}, nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusConflict:
		// 409: the same key is still being processed; 429: refused before
		// any work. Neither accepted it.
		return Receipt{}, &Error{Retryable, statusError(resp, raw)}
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		// Refused before any work, for the credential, not the message:
		// the message waits (retried) rather than failing for good.
		return Receipt{}, &Error{Retryable, credentialError(resp, raw)}
	case resp.StatusCode >= 500:
		// A server error says nothing of what happened before it: the
		// provider may have accepted the message and then failed. Like a
		// timeout, the outcome is unknown: looked up where the provider can
		// be asked, left to the kind's resend/skip policy where it cannot.
		return Receipt{}, &Error{Unknown, statusError(resp, raw)}
	case resp.StatusCode >= 400:
		return Receipt{}, &Error{Rejected, statusError(resp, raw)}
	default:
		// A 1xx or 3xx is no answer of this API (redirects are not
		// followed): it says neither accepted nor refused, so, like a 5xx,
		// the outcome is unknown.
		return Receipt{}, &Error{Unknown, statusError(resp, raw)}
	}
}

// Ping asks the provider's GET /healthz whether it answers.
func (p *HTTPProvider) Ping(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("provider health: %w", statusError(resp, raw))
	}
	return nil
}

// Lookup asks for the message accepted under key.
func (p *HTTPProvider) Lookup(ctx context.Context, key string) (Receipt, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/v1/messages?idempotency_key="+url.QueryEscape(key), nil)
	if err != nil {
		return Receipt{}, false, err
	}
	resp, err := p.do(req)
	if err != nil {
		return Receipt{}, false, transportError(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch resp.StatusCode {
	case http.StatusOK:
		var mr messageResponse
		if err := json.Unmarshal(raw, &mr); err != nil || mr.MessageID == "" {
			return Receipt{}, false, fmt.Errorf("lookup: unreadable answer %q", answerText(raw))
		}
		return Receipt{MessageID: mr.MessageID}, true, nil
	case http.StatusNotFound:
		return Receipt{}, false, nil
	case http.StatusUnauthorized, http.StatusForbidden:
		return Receipt{}, false, fmt.Errorf("lookup: %w", credentialError(resp, raw))
	default:
		return Receipt{}, false, fmt.Errorf("lookup: %w", statusError(resp, raw))
	}
}

func (p *HTTPProvider) do(req *http.Request) (*http.Response, error) {
	if p.auth != "" {
		req.Header.Set("Authorization", p.auth)
	}
	return p.client.Do(req)
}

// HTTPError is a provider's answer other than success. Its HTTPStatusCode
// lets outage.Unavailable tell a server error or throttling (5xx, 429),
// which may be the provider's outage, from a verdict on the message.
type HTTPError struct {
	Status string // "503 Service Unavailable"
	Code   int
	Body   string // the answer, phone numbers masked, cut to 300 bytes
}

func (e *HTTPError) Error() string { return e.Status + ": " + e.Body }

// HTTPStatusCode is the response's status code.
func (e *HTTPError) HTTPStatusCode() int { return e.Code }

func statusError(resp *http.Response, raw []byte) error {
	return &HTTPError{Status: resp.Status, Code: resp.StatusCode, Body: answerText(raw)}
}

func credentialError(resp *http.Response, raw []byte) error {
	return fmt.Errorf("%w (SMS_PROVIDER_API_KEY, a key with the role send): %w", ErrCredential, statusError(resp, raw))
}

// transportError classifies an error of http.Client.Do: a failure to
// connect means the request never left, anything later (timeout, reset)
// leaves the outcome unknown.
func transportError(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return &Error{Retryable, err}
	}
	return &Error{Unknown, err}
}

// answerText is the provider's answer b as it may enter an error (and so
// the sender's logs and the row's last_error and failure_reason): phone
// numbers masked (contract.MaskPhones), since a provider's answer often
// repeats the number it was sent to, then cut to 300 bytes. Every piece of
// an answer that goes into an error goes through it.
func answerText(b []byte) string {
	s := contract.MaskPhones(strings.TrimSpace(string(b)))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
