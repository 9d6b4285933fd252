package idemdynamo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// NewClient returns a DynamoDB client configured the standard AWS way
// (config.LoadDefaultConfig), so AWS_ENDPOINT_URL (or
// AWS_ENDPOINT_URL_DYNAMODB) points it at a local server such as moto or
// LocalStack, as for SQS. With an endpoint override and no credentials set,
// static "test" credentials are used and the region defaults to us-east-1;
// against real AWS the normal chain is left alone.
func NewClient(ctx context.Context) (*dynamodb.Client, error) {
	var opts []func(*config.LoadOptions) error
	overridden := os.Getenv("AWS_ENDPOINT_URL") != "" || os.Getenv("AWS_ENDPOINT_URL_DYNAMODB") != ""
	if overridden && os.Getenv("AWS_ACCESS_KEY_ID") == "" && os.Getenv("AWS_PROFILE") == "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("idemdynamo: load AWS config: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	return dynamodb.NewFromConfig(cfg), nil
}

// TableAPI is the part of *dynamodb.Client that EnsureTable uses.
type TableAPI interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// EnsureTable creates the dedupe table (consumer HASH, event_id RANGE, on
// demand) if it does not exist, waits until it is active, and turns on TTL
// on expires_at. It is idempotent. DynamoDB deletes expired items lazily
// (typically within days), so an item outlives its window a little: the
// safe side, since a copy within the window is still recognised.
func EnsureTable(ctx context.Context, db TableAPI, table string) error {
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(AttrConsumer), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(AttrEventID), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(AttrConsumer), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(AttrEventID), KeyType: types.KeyTypeRange},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("idemdynamo: create table %s: %w", table, err)
	}
	if err := WaitActive(ctx, db, table); err != nil {
		return err
	}
	_, err = db.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(AttrExpiresAt), Enabled: aws.Bool(true),
		},
	})
	// Enabling TTL twice is refused with a ValidationException ("already
	// enabled"): that is the state we want.
	var ve interface{ ErrorCode() string }
	if err != nil && !(errors.As(err, &ve) && ve.ErrorCode() == "ValidationException") {
		return fmt.Errorf("idemdynamo: enable TTL on %s: %w", table, err)
	}
	return nil
}

// WaitActive waits until table exists and is ACTIVE.
func WaitActive(ctx context.Context, db TableAPI, table string) error {
	w := dynamodb.NewTableExistsWaiter(db)
	if err := w.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, maxWait); err != nil {
		return fmt.Errorf("idemdynamo: table %s not active: %w", table, err)
	}
	return nil
}

const maxWait = 2 * time.Minute // a new on-demand table is active in seconds
