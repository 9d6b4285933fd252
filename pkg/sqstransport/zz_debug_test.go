package sqstransport_test

import (
	"context"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/logging"
	"github.com/effectively-once/payments-cashback/internal/testenv"
)

type eager struct{ rt http.RoundTripper }

func (e eager) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := e.rt.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "EAGER: read %d of content-length %d: %v; headers %v\n", len(b), resp.ContentLength, err, resp.Header)
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}

func TestZZDebugBareReceive(t *testing.T) {
	base := testenv.SQS(t)
	c := sqs.New(base.Options(), func(o *sqs.Options) {
		o.Retryer = aws.NopRetryer{}
		o.ClientLogMode = aws.LogRetries
		o.Logger = logging.NewStandardLogger(os.Stderr)
		if os.Getenv("SDKT") != "" { o.HTTPClient = &http.Client{Transport: eager{awshttp.NewBuildableClient().GetTransport()}} } else if os.Getenv("PLAIN") != "" { o.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()} } else { o.HTTPClient = &http.Client{Transport: eager{http.DefaultTransport.(*http.Transport).Clone()}} }
	})
	for round := 0; round < 3; round++ {
		q, _ := testenv.Queue(t, c, 5, 30*time.Second)
		n := 12000
		sendAll(t, base, q, relayMessages(t, n))
		start := time.Now()
		got, errs := 0, 0
		for got < n && time.Since(start) < 10*time.Second {
			out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), MaxNumberOfMessages: 10, MessageAttributeNames: []string{"All"}})
			if err != nil {
				errs++
				t.Logf("receive error after %d: %v", got, err)
				continue
			}
			got += len(out.Messages)
		}
		t.Logf("round %d: %d of %d in %v, %d errors", round, got, n, time.Since(start), errs)
	}
}
