package testenv

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"testing"
)

// DynamoDB returns a DynamoDB client on the moto server of MotoEndpoint
// (skipping the test, with the reason, where there is none). Static test
// credentials and region us-east-1, whatever the environment says. Tables
// are shared by every test of the process: name them per test
// (UniqueName).
func DynamoDB(t testing.TB) *dynamodb.Client {
	t.Helper()
	return DynamoDBAt(MotoEndpoint(t))
}

// DynamoDBAt is a DynamoDB client on endpoint with static test credentials.
func DynamoDBAt(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
}

// UniqueName is prefix followed by random hex: a table, queue or key space
// of one test.
func UniqueName(prefix string) string { return prefix + randomHex(4) }
