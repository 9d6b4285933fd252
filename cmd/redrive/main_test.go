package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Bad arguments are refused with status 2 and a line saying what is wrong,
// before any queue is touched (the endpoint here answers nothing). A
// negative -max used to be read as "no limit" and empty the whole DLQ.
func TestBadArgumentsAreRefusedBeforeAnyQueueIsTouched(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-source", "payments-events-dlq", "-max", "-1"}, "-max -1"},
		{[]string{"-source", "payments-events"}, "does not end in -dlq"},
		{[]string{"-source", "payments-events-dlq", "now"}, `unexpected argument "now"`},
		{[]string{"-max", "3"}, "-source is required"},
		{[]string{"-source", "payments-events-dlq", "-timeout", "0s"}, "-timeout 0s"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.says) || out.Len() != 0 {
			t.Errorf("%v: status %d, stdout %q, stderr %q; want 2 saying %q", tc.args, code, out.String(), errb.String(), tc.says)
		}
	}
}
