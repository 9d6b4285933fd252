package sqstransport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// DefaultRegion is used when neither AWS_REGION nor a profile names one; a
// local SQS server accepts any region, and real AWS needs one to sign.
const DefaultRegion = "us-east-1"

// NewClient returns an SQS client configured the standard AWS way
// (config.LoadDefaultConfig): environment, shared config files, roles.
// AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_SQS) points it at a local server such
// as fauxqs or LocalStack; unset means real AWS, which is allowed.
//
// Two fallbacks keep local runs zero-config: the region defaults to
// us-east-1, and when an endpoint override is set but no credentials are
// (no AWS_ACCESS_KEY_ID, no AWS_PROFILE), static "test" credentials are used,
// so the SDK does not wander off to the EC2 metadata service looking for a
// role. Against real AWS the normal credential chain is left untouched.
func NewClient(ctx context.Context) (*sqs.Client, error) {
	var opts []func(*config.LoadOptions) error
	if endpointOverridden() && os.Getenv("AWS_ACCESS_KEY_ID") == "" && os.Getenv("AWS_PROFILE") == "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider("test", "test", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("sqstransport: load AWS config: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.HTTPClient = NewHTTPClient() }), nil
}

// NewHTTPClient is the HTTP client NewClient uses; it reads each response body completely before the SDK sees
// it. Without it, about one call in a thousand fails while the SDK reads a
// 200 response ("deserialization failed ... use of closed network
// connection": net/http's writeLoop closes the connection after the SDK has
// closed the request body; aws/aws-sdk-go-v2#1825, #2737, seen against real
// AWS too). The SDK retries such calls, but for ReceiveMessage the lost
// response's messages stay invisible for a whole visibility timeout, and for
// SendMessageBatch the retry sends duplicates. SQS responses are small JSON
// documents, so buffering them costs nothing.
func NewHTTPClient() *http.Client {
	return &http.Client{Transport: eagerBody{awshttp.NewBuildableClient().GetTransport()}}
}

type eagerBody struct{ next http.RoundTripper }

func (e eagerBody) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := e.next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

func endpointOverridden() bool {
	return os.Getenv("AWS_ENDPOINT_URL") != "" || os.Getenv("AWS_ENDPOINT_URL_SQS") != ""
}
