package sms_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/notifications/sms"
)

// Every 2xx is the provider accepting the message: a 202 Accepted ("queued
// for delivery", the usual answer of real SMS APIs) is read for its message
// id like a 201, where it used to be classified Rejected and the row of a
// delivered SMS ended FAILED. Only a 4xx is a rejection; a 1xx or 3xx this
// API never gives leaves the outcome unknown (the message may have been
// accepted), resolved by lookup or the kind's policy, and is never
// followed: a redirect is not the provider's answer.
func TestSendTakesEvery2xxAsAcceptedAndOnlyA4xxAsARejection(t *testing.T) {
	for _, tc := range []struct {
		status  int
		body    string
		want    sms.Class // when err != nil
		wantErr bool
		id      string
	}{
		{status: http.StatusOK, body: `{"message_id":"sms_000001"}`, id: "sms_000001"},
		{status: http.StatusCreated, body: `{"message_id":"sms_000001"}`, id: "sms_000001"},
		{status: http.StatusAccepted, body: `{"message_id":"sms_000001","status":"queued"}`, id: "sms_000001"},
		{status: http.StatusNoContent, wantErr: true, want: sms.Unknown}, // accepted, no id to read
		{status: http.StatusMultipleChoices, body: `{}`, wantErr: true, want: sms.Unknown},
		{status: http.StatusFound, wantErr: true, want: sms.Unknown},
		{status: http.StatusTemporaryRedirect, wantErr: true, want: sms.Unknown},
		{status: http.StatusBadRequest, body: `{"error":"bad"}`, wantErr: true, want: sms.Rejected},
		{status: http.StatusUnprocessableEntity, body: `{"error":"bad"}`, wantErr: true, want: sms.Rejected},
		{status: http.StatusServiceUnavailable, wantErr: true, want: sms.Unknown},
	} {
		var requests atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			if r.URL.Path != "/v1/messages" {
				t.Errorf("%d: a request to %s: the redirect was followed", tc.status, r.URL.Path)
			}
			if tc.status/100 == 3 {
				w.Header().Set("Location", "/elsewhere")
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(tc.body))
		}))
		p := sms.NewHTTPProvider(srv.URL, "k", time.Second)
		rc, err := p.Send(context.Background(), sms.Message{IdempotencyKey: "sms:x", To: "+919800000017", Body: "hi"})
		srv.Close()
		switch {
		case !tc.wantErr && (err != nil || rc.MessageID != tc.id):
			t.Errorf("%d: Send = %+v, %v; want accepted with message id %s", tc.status, rc, err, tc.id)
		case tc.wantErr && err == nil:
			t.Errorf("%d: Send = %+v, accepted; want %s", tc.status, rc, tc.want)
		case tc.wantErr && sms.Classify(err) != tc.want:
			t.Errorf("%d: classified %s (%v); want %s", tc.status, sms.Classify(err), err, tc.want)
		}
		if n := requests.Load(); n != 1 {
			t.Errorf("%d: the provider saw %d requests; want 1", tc.status, n)
		}
	}
}
