package testenv

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// DynamoDB returns a DynamoDB client on the moto server of MotoEndpoint
// (skipping the test, with the reason, where there is none). Static test
// credentials and region us-east-1, whatever the environment says. Tables
// are shared by every test of the process: name them per test
// (UniqueName).
//
// Its requests reach moto one at a time. DynamoDB runs transactions
// serializably; moto runs each request on a thread of its own and applies
// a TransactWriteItems by copying the tables it touches and putting the
// copies back if the transaction is cancelled, without a lock, so a
// cancelled transaction can undo writes that another request committed in
// the meantime (seen here: a credit lost, a wallet credited twice). Copies
// handled by concurrent goroutines still interleave at every call; only
// the server's work on each call is serial, as DynamoDB's is per item.
func DynamoDB(t testing.TB) *dynamodb.Client {
	t.Helper()
	return DynamoDBAt(MotoEndpoint(t))
}

// DynamoDBAt is a DynamoDB client on endpoint with static test credentials,
// its requests serialised as DynamoDB's doc explains.
func DynamoDBAt(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:   &http.Client{Transport: serial{awshttp.NewBuildableClient().GetTransport()}},
	})
}

// motoMu serialises every request of this process to moto's DynamoDB.
var motoMu sync.Mutex

type serial struct{ next http.RoundTripper }

func (s serial) RoundTrip(r *http.Request) (*http.Response, error) {
	motoMu.Lock()
	defer motoMu.Unlock()
	resp, err := s.next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body) // the whole response, while the lock is held
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// UniqueName is prefix followed by random hex: a table, queue or key space
// of one test.
func UniqueName(prefix string) string { return prefix + randomHex(4) }
