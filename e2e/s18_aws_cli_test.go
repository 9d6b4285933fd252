package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 17. The AWS CLI, the client operators use, as an outside client
// of the queues: two copies of a PaymentSucceeded that was already applied,
// injected with `aws sqs send-message`, are duplicates (acked, nothing
// applied again); a malformed body injected the same way is parked, and
// `aws sqs receive-message --message-attribute-names All` on the DLQ shows
// it with its park_reason; `aws sqs get-queue-attributes` counts the DLQ's
// backlog as the SDK does.
func TestCopiesInjectedWithTheAWSCLIAreDuplicatesAndTheDLQReadWithItShowsTheParkReason(t *testing.T) {
	if _, err := exec.LookPath("aws"); err != nil {
		t.Skip("no aws on PATH (the AWS CLI: pip install awscli): the outside-client scenario needs it")
	}
	dup0 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate")
	app0 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied")

	user := id("u_e2e16")
	p := pay(t, user, 120000)
	e := outboxEventID(t, s.payDB, p.ID, contract.PaymentSucceeded)
	waitCredits(t, p.ID, 1)
	ev := outboxEnvelope(t, s.payDB, e)
	attrs := fmt.Sprintf(`{"event_id":{"DataType":"String","StringValue":%q},"event_type":{"DataType":"String","StringValue":%q}}`,
		ev.EventID.String(), ev.EventType)
	for range 2 {
		out := awsSQS(t, "send-message", "--queue-url", s.payQ, "--message-body", body(t, ev), "--message-attributes", attrs)
		if decode[struct{ MessageId string }](t, out).MessageId == "" {
			t.Fatalf("aws sqs send-message answered without a MessageId: %s", out)
		}
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		d := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate") - dup0
		return d == 2, fmt.Sprintf("rewards saw %v duplicate copies, want the 2 the CLI sent", d)
	})
	if a := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied") - app0; a != 1 {
		t.Errorf("rewards applied %v messages, want 1 (the relay's copy)", a)
	}
	pipelineOnce(t, p.ID, 2400)
	if n := processed(t, e); n != 1 {
		t.Errorf("%d dedupe rows for %s, want 1", n, e)
	}
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}

	// Poison from the CLI, read back from the DLQ with the CLI.
	marker := id("cli_poison")
	malformed := `{"event_id": "` + marker + `", "event_type": "PaymentSucceeded", ` // cut short
	awsSQS(t, "send-message", "--queue-url", s.payQ, "--message-body", malformed)
	type cliMessage struct {
		Body              string
		MessageAttributes map[string]struct{ StringValue string }
	}
	var parked cliMessage
	eventually(t, 30*time.Second, func() (bool, string) {
		// Visibility 0: reading leaves every message visible, so this read
		// hides nothing from other readers of the DLQ.
		out := awsSQS(t, "receive-message", "--queue-url", s.payDLQ, "--message-attribute-names", "All",
			"--max-number-of-messages", "10", "--visibility-timeout", "0", "--wait-time-seconds", "1")
		if len(strings.TrimSpace(string(out))) == 0 {
			return false, "the DLQ is empty" // the CLI prints nothing for no messages
		}
		for _, m := range decode[struct{ Messages []cliMessage }](t, out).Messages {
			if strings.Contains(m.Body, marker) {
				parked = m
				return true, ""
			}
		}
		return false, "the malformed message is not (yet) among those the CLI read from the DLQ"
	})
	if parked.Body != malformed {
		t.Errorf("the parked body was changed: %q", parked.Body)
	}
	if r := parked.MessageAttributes["park_reason"].StringValue; !strings.HasPrefix(r, "undecodable: events: invalid body") {
		t.Errorf("park_reason as the CLI shows it: %q, want it to start with %q", r, "undecodable: events: invalid body")
	}
	if q := parked.MessageAttributes["park_source_queue"].StringValue; q != "payments-events" {
		t.Errorf("park_source_queue as the CLI shows it: %q, want payments-events", q)
	}

	// The backlog, counted by the CLI and by the SDK: the same number, and
	// at least the message just parked. Visible plus in flight: fauxqs
	// counts a message received with visibility 0 as not visible, moto and
	// SQS as visible, so either attribute alone differs between servers.
	out := awsSQS(t, "get-queue-attributes", "--queue-url", s.payDLQ,
		"--attribute-names", "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible")
	cli := 0
	for k, v := range decode[struct{ Attributes map[string]string }](t, out).Attributes {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("aws sqs get-queue-attributes: %s = %q in %s", k, v, out)
		}
		cli += n
	}
	if n := depth(t, s.payDLQ); cli < 1 || cli != n {
		t.Errorf("DLQ backlog: the CLI counts %d, the SDK %d; want the same, at least 1", cli, n)
	}
	take(t, s.payDLQ, func(m types.Message) bool { return strings.Contains(aws.ToString(m.Body), marker) })
}

// awsSQS runs `aws sqs ARGS...` against the suite's SQS server, the way an
// operator would (--endpoint-url; test credentials from the environment),
// and returns its JSON output.
func awsSQS(t testing.TB, args ...string) []byte {
	t.Helper()
	ep := os.Getenv("AWS_ENDPOINT_URL_SQS")
	if ep == "" {
		ep = os.Getenv("AWS_ENDPOINT_URL")
	}
	cmd := exec.Command("aws", append([]string{"sqs"}, append(args, "--endpoint-url", ep, "--output", "json")...)...)
	cmd.Env = append(os.Environ(), "AWS_DEFAULT_REGION="+os.Getenv("AWS_REGION"), "AWS_PAGER=")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("aws sqs %s: %v\n%s", args[0], err, stderr)
	}
	if len(out) > 0 && !json.Valid(out) {
		t.Fatalf("aws sqs %s: output is not JSON: %s", args[0], out)
	}
	return out
}
