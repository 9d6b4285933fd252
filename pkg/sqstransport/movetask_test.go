package sqstransport_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// The move-task path of Redrive has run against no real server (fauxqs and
// moto lack StartMessageMoveTask; LocalStack and AWS cannot run here), so
// these tests replay the responses SQS documents for it (API reference:
// StartMessageMoveTask, ListMessageMoveTasks, and the JSON protocol's error
// shape) through an httptest server speaking the JSON protocol.

// sqsReplay answers each X-Amz-Target operation with a handler, records the
// operations it saw in order, and forwards any other operation to next (a
// real SQS server), or answers 400 UnknownOperation when next is nil.
type sqsReplay struct {
	mu   sync.Mutex
	ops  []string
	reqs map[string][]map[string]any
	on   map[string]func(w http.ResponseWriter, body map[string]any)
	next http.Handler
}

func (r *sqsReplay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	op := strings.TrimPrefix(req.Header.Get("X-Amz-Target"), "AmazonSQS.")
	raw, _ := io.ReadAll(req.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	r.mu.Lock()
	r.ops = append(r.ops, op)
	if r.reqs == nil {
		r.reqs = map[string][]map[string]any{}
	}
	r.reqs[op] = append(r.reqs[op], body)
	h := r.on[op]
	r.mu.Unlock()
	switch {
	case h != nil:
		h(w, body)
	case r.next != nil:
		req.Body = io.NopCloser(strings.NewReader(string(raw)))
		req.ContentLength = int64(len(raw))
		r.next.ServeHTTP(w, req)
	default:
		sqsError(w, http.StatusBadRequest, "UnsupportedOperation", "not replayed: "+op)
	}
}

func (r *sqsReplay) count(op string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs[op])
}

func (r *sqsReplay) request(op string, i int) map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[op][i]
}

// sqsJSON writes a JSON-protocol success response.
func sqsJSON(w http.ResponseWriter, v string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_, _ = io.WriteString(w, v)
}

// sqsError writes a JSON-protocol error the way SQS does: the __type names
// the error shape, x-amzn-query-error carries the legacy code.
func sqsError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("x-amzn-query-error", "AWS.SimpleQueueService."+code+";Sender")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `{"__type":"com.amazonaws.sqs#%s","message":%q}`, code, msg)
}

// replayClient is an SQS client whose endpoint is srv.
func replayClient(srv *httptest.Server) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       sqstransport.DefaultRegion,
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:   sqstransport.NewHTTPClient(),
	})
}

const (
	replayDLQ     = "http://sqs.us-east-1.localhost/000000000000/orders-dlq"
	replayDLQArn  = "arn:aws:sqs:us-east-1:000000000000:orders-dlq"
	replayDest    = "http://sqs.us-east-1.localhost/000000000000/orders"
	replayDestArn = "arn:aws:sqs:us-east-1:000000000000:orders"
	replayHandle  = "eyJ0YXNrSWQiOiJkYzE2OWUwNC0wZTU1LTQ0ZDItYWE5MC1jMDgwY2ExZjM2ZjciLCJzb3VyY2VBcm4iOiJhcm46YXdzOnNxczp1cy1lYXN0LTE6MDAwMDAwMDAwMDAwOm9yZGVycy1kbHEifQ=="
)

// queueArns answers GetQueueAttributes(QueueArn) for the two replayed queues.
func queueArns(w http.ResponseWriter, body map[string]any) {
	arn := map[string]string{replayDLQ: replayDLQArn, replayDest: replayDestArn}[fmt.Sprint(body["QueueUrl"])]
	if arn == "" {
		sqsError(w, http.StatusBadRequest, "QueueDoesNotExist", "The specified queue does not exist.")
		return
	}
	sqsJSON(w, `{"Attributes":{"QueueArn":"`+arn+`"}}`)
}

// Where the server has StartMessageMoveTask, Redrive starts a task from the
// DLQ's ARN to the destination's, polls ListMessageMoveTasks until the task
// is COMPLETED, and returns its ApproximateNumberOfMessagesMoved; it never
// moves messages itself. The listing follows SQS's documentation: a RUNNING
// task carries its TaskHandle, a finished one does not, newest first, with
// an older finished task of the same source after it.
func TestRedriveUsesTheMessageMoveTaskWhereTheServerHasIt(t *testing.T) {
	t.Parallel()
	lists := 0
	rp := &sqsReplay{on: map[string]func(http.ResponseWriter, map[string]any){
		"GetQueueAttributes":   queueArns,
		"StartMessageMoveTask": func(w http.ResponseWriter, _ map[string]any) { sqsJSON(w, `{"TaskHandle":"`+replayHandle+`"}`) },
		"ListMessageMoveTasks": func(w http.ResponseWriter, _ map[string]any) {
			lists++
			older := `{"Status":"COMPLETED","SourceArn":"` + replayDLQArn + `","DestinationArn":"` + replayDestArn + `",
				"ApproximateNumberOfMessagesMoved":29,"ApproximateNumberOfMessagesToMove":0,"StartedTimestamp":1442428276921}`
			if lists == 1 {
				sqsJSON(w, `{"Results":[{"TaskHandle":"`+replayHandle+`","Status":"RUNNING","SourceArn":"`+replayDLQArn+`",
					"DestinationArn":"`+replayDestArn+`","MaxNumberOfMessagesPerSecond":50,
					"ApproximateNumberOfMessagesMoved":3,"ApproximateNumberOfMessagesToMove":7,"StartedTimestamp":1700000000000},`+older+`]}`)
				return
			}
			sqsJSON(w, `{"Results":[{"Status":"COMPLETED","SourceArn":"`+replayDLQArn+`","DestinationArn":"`+replayDestArn+`",
				"ApproximateNumberOfMessagesMoved":7,"ApproximateNumberOfMessagesToMove":0,"StartedTimestamp":1700000000000},`+older+`]}`)
		},
	}}
	srv := httptest.NewServer(rp)
	defer srv.Close()

	moved, err := sqstransport.Redrive(context.Background(), replayClient(srv), replayDLQ, replayDest, 0)
	if err != nil || moved != 7 {
		t.Fatalf("Redrive = %d, %v; want 7 (the task's ApproximateNumberOfMessagesMoved), nil", moved, err)
	}
	if got := rp.request("StartMessageMoveTask", 0); got["SourceArn"] != replayDLQArn || got["DestinationArn"] != replayDestArn {
		t.Errorf("StartMessageMoveTask request %v, want SourceArn %s and DestinationArn %s", got, replayDLQArn, replayDestArn)
	}
	if n := rp.count("ListMessageMoveTasks"); n != 2 {
		t.Errorf("ListMessageMoveTasks called %d times, want 2 (RUNNING, then COMPLETED)", n)
	}
	for _, op := range []string{"ReceiveMessage", "SendMessageBatch", "DeleteMessageBatch"} {
		if n := rp.count(op); n != 0 {
			t.Errorf("%s called %d times: the manual path ran although the move task did the work", op, n)
		}
	}
}

// A move task that ends FAILED is an error naming SQS's FailureReason, and
// Redrive does not then move messages by hand behind the task's back.
func TestRedriveReportsAFailedMessageMoveTask(t *testing.T) {
	t.Parallel()
	rp := &sqsReplay{on: map[string]func(http.ResponseWriter, map[string]any){
		"GetQueueAttributes":   queueArns,
		"StartMessageMoveTask": func(w http.ResponseWriter, _ map[string]any) { sqsJSON(w, `{"TaskHandle":"`+replayHandle+`"}`) },
		"ListMessageMoveTasks": func(w http.ResponseWriter, _ map[string]any) {
			sqsJSON(w, `{"Results":[{"Status":"FAILED","FailureReason":"AWS.SimpleQueueService.NonExistentQueue",
				"SourceArn":"`+replayDLQArn+`","DestinationArn":"`+replayDestArn+`",
				"ApproximateNumberOfMessagesMoved":2,"ApproximateNumberOfMessagesToMove":5,"StartedTimestamp":1700000000000}]}`)
		},
	}}
	srv := httptest.NewServer(rp)
	defer srv.Close()

	moved, err := sqstransport.Redrive(context.Background(), replayClient(srv), replayDLQ, replayDest, 0)
	if err == nil || !strings.Contains(err.Error(), "FAILED") || !strings.Contains(err.Error(), "NonExistentQueue") {
		t.Fatalf("Redrive = %d, %v; want an error naming FAILED and the FailureReason", moved, err)
	}
	if moved != 2 {
		t.Errorf("moved %d, want the task's 2", moved)
	}
	if n := rp.count("ReceiveMessage"); n != 0 {
		t.Errorf("ReceiveMessage called %d times after the task failed", n)
	}
}

// A server without StartMessageMoveTask says so in many ways; each of them
// makes Redrive fall back to receive → re-send → delete, which then moves
// every message of a real DLQ (the test's SQS server, behind a proxy that
// answers only StartMessageMoveTask). An error that is a real SQS answer
// about the request (a missing queue, a denied caller, a JSON InternalError)
// is returned instead: falling back then would hide it.
func TestRedriveFallsBackOnAnyServerWithoutMessageMoveTasks(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	target, err := url.Parse(testenv.SQSEndpoint(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)

	raw := func(status int, contentType, body string) func(http.ResponseWriter, map[string]any) {
		return func(w http.ResponseWriter, _ map[string]any) {
			if contentType != "" {
				w.Header().Set("Content-Type", contentType)
			}
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}
	}
	code := func(status int, code string) func(http.ResponseWriter, map[string]any) {
		return func(w http.ResponseWriter, _ map[string]any) { sqsError(w, status, code, "no") }
	}
	// moto 5.2.1's answer, byte for byte.
	const motoHTML = "<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n<h1>Internal Server Error</h1>\n" +
		"<p>The server encountered an internal error and was unable to complete your request. Either the server is overloaded or there is an error in the application.</p>\n"
	for _, tc := range []struct {
		name     string
		answer   func(http.ResponseWriter, map[string]any)
		fallBack bool
	}{
		{"fauxqs: 400 InvalidAction", code(http.StatusBadRequest, "InvalidAction"), true},
		{"400 UnsupportedOperation", code(http.StatusBadRequest, "UnsupportedOperation"), true},
		{"400 UnknownOperationException", code(http.StatusBadRequest, "UnknownOperationException"), true},
		{"400 plain text", raw(http.StatusBadRequest, "text/plain", "Bad Request"), true},
		{"404 empty", raw(http.StatusNotFound, "", ""), true},
		{"404 HTML", raw(http.StatusNotFound, "text/html", "<html><body>Not Found</body></html>"), true},
		{"405 empty", raw(http.StatusMethodNotAllowed, "", ""), true},
		{"501 JSON", code(http.StatusNotImplemented, "NotImplemented"), true},
		{"501 empty", raw(http.StatusNotImplemented, "", ""), true},
		{"moto: 500 HTML", raw(http.StatusInternalServerError, "text/html; charset=utf-8", motoHTML), true},
		{"500 JSON without __type", raw(http.StatusInternalServerError, "application/x-amz-json-1.0", `{"message":"boom"}`), true},

		{"400 QueueDoesNotExist", code(http.StatusBadRequest, "QueueDoesNotExist"), false},
		{"400 InvalidParameterValue", code(http.StatusBadRequest, "InvalidParameterValue"), false},
		{"403 AccessDenied", code(http.StatusForbidden, "AccessDenied"), false},
		{"500 JSON InternalError", code(http.StatusInternalServerError, "InternalError"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
			const n = 3
			for i := range n {
				if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlq), MessageBody: aws.String(fmt.Sprint(i))}); err != nil {
					t.Fatal(err)
				}
			}
			rp := &sqsReplay{next: proxy, on: map[string]func(http.ResponseWriter, map[string]any){"StartMessageMoveTask": tc.answer}}
			srv := httptest.NewServer(rp)
			defer srv.Close()

			moved, err := sqstransport.Redrive(ctx, replayClient(srv), dlq, q, 0)
			if rp.count("StartMessageMoveTask") == 0 {
				t.Fatal("Redrive did not ask for a move task")
			}
			if tc.fallBack {
				if err != nil || moved != n {
					t.Fatalf("Redrive = %d, %v; want the manual path to move %d, nil", moved, err, n)
				}
				if got := len(drain(t, c, q)); got != n {
					t.Errorf("source holds %d, want %d", got, n)
				}
				if got := len(drain(t, c, dlq)); got != 0 {
					t.Errorf("DLQ still holds %d", got)
				}
				return
			}
			if err == nil {
				t.Fatalf("Redrive = %d, nil; want the server's error, not a fallback", moved)
			}
			if k := rp.count("ReceiveMessage"); k != 0 {
				t.Errorf("ReceiveMessage called %d times: fell back on an error that is not 'unsupported' (%v)", k, err)
			}
			if got := len(drain(t, c, dlq)); got != n {
				t.Errorf("DLQ holds %d, want all %d still there", got, n)
			}
		})
	}
}

// A move task still running when Redrive's context ends (the operator's
// -timeout, or Ctrl-C) is cancelled, not left moving messages after the
// tool has given up (SQS runs one task per queue at a time, so the next
// redrive could not even start), and Redrive reports what it moved. It
// used to answer 0 and leave the task running.
func TestAMoveTaskRunningWhenRedriveIsStoppedIsCancelled(t *testing.T) {
	t.Parallel()
	rp := &sqsReplay{on: map[string]func(http.ResponseWriter, map[string]any){
		"GetQueueAttributes":   queueArns,
		"StartMessageMoveTask": func(w http.ResponseWriter, _ map[string]any) { sqsJSON(w, `{"TaskHandle":"`+replayHandle+`"}`) },
		"ListMessageMoveTasks": func(w http.ResponseWriter, _ map[string]any) {
			sqsJSON(w, `{"Results":[{"TaskHandle":"`+replayHandle+`","Status":"RUNNING","SourceArn":"`+replayDLQArn+`",
				"DestinationArn":"`+replayDestArn+`","ApproximateNumberOfMessagesMoved":40,"ApproximateNumberOfMessagesToMove":100000}]}`)
		},
		"CancelMessageMoveTask": func(w http.ResponseWriter, _ map[string]any) { sqsJSON(w, `{"ApproximateNumberOfMessagesMoved":41}`) },
	}}
	srv := httptest.NewServer(rp)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	moved, err := sqstransport.Redrive(ctx, replayClient(srv), replayDLQ, replayDest, 0)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(fmt.Sprint(err), "cancelled") {
		t.Errorf("Redrive: %v, want the deadline, saying the task was cancelled", err)
	}
	if rp.count("CancelMessageMoveTask") != 1 || rp.request("CancelMessageMoveTask", 0)["TaskHandle"] != replayHandle {
		t.Errorf("CancelMessageMoveTask calls %d, want 1 for the task's handle", rp.count("CancelMessageMoveTask"))
	}
	if moved != 41 {
		t.Errorf("moved %d, want the 41 the cancel reported", moved)
	}
}

// Only the start of a move task decides whether the server has them: once
// it started, a failed poll (a proxy's HTML error page) is an error, not a
// reason to run the manual path beside the task on the same DLQ.
func TestAFailedPollOfAStartedMoveTaskDoesNotRunTheManualPathBesideIt(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	target, err := url.Parse(testenv.SQSEndpoint(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	for i := range 3 {
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlq), MessageBody: aws.String(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	rp := &sqsReplay{next: httputil.NewSingleHostReverseProxy(target), on: map[string]func(http.ResponseWriter, map[string]any){
		"StartMessageMoveTask": func(w http.ResponseWriter, _ map[string]any) { sqsJSON(w, `{"TaskHandle":"`+replayHandle+`"}`) },
		"ListMessageMoveTasks": func(w http.ResponseWriter, _ map[string]any) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "<html>gateway hiccup</html>")
		},
		"CancelMessageMoveTask": func(w http.ResponseWriter, _ map[string]any) { sqsJSON(w, `{"ApproximateNumberOfMessagesMoved":0}`) },
	}}
	srv := httptest.NewServer(rp)
	defer srv.Close()
	moved, err := sqstransport.Redrive(ctx, replayClient(srv), dlq, q, 0)
	if err == nil {
		t.Errorf("Redrive moved %d and said nothing of the failed polls", moved)
	}
	if n := rp.count("ReceiveMessage"); n != 0 {
		t.Errorf("the manual path ran (%d receives) beside the started move task", n)
	}
}
