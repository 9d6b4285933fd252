#!/bin/bash
# Runs inside LocalStack once it is ready (mounted at
# /etc/localstack/init/ready.d). Creates each queue's DLQ first, then the
# queue with a RedrivePolicy pointing at it: maxReceiveCount 5
# (MAX_RECEIVE_COUNT), 14 days' retention on both, a 30 s visibility
# timeout: the same topology `go run ./cmd/queues` creates on the local
# stack (sqstransport.EnsureQueue).
set -euo pipefail
MAX_RECEIVE="${MAX_RECEIVE_COUNT:-5}"
for q in payments-events rewards-events; do
  awslocal sqs create-queue --queue-name "${q}-dlq" \
    --attributes MessageRetentionPeriod=1209600 >/dev/null
  dlq_arn=$(awslocal sqs get-queue-attributes \
    --queue-url "http://localhost:4566/000000000000/${q}-dlq" \
    --attribute-names QueueArn --query Attributes.QueueArn --output text)
  awslocal sqs create-queue --queue-name "$q" --attributes "{
    \"VisibilityTimeout\": \"30\",
    \"MessageRetentionPeriod\": \"1209600\",
    \"RedrivePolicy\": \"{\\\"deadLetterTargetArn\\\":\\\"${dlq_arn}\\\",\\\"maxReceiveCount\\\":\\\"${MAX_RECEIVE}\\\"}\"
  }" >/dev/null
  echo "queue ${q} -> ${q}-dlq (maxReceiveCount ${MAX_RECEIVE})"
done
