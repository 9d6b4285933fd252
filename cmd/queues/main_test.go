package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A stray word stops flag parsing, so every flag after it would be lost,
// and EnsureQueue would set the defaults on the live queues: the command
// refuses it with status 2 before it connects to anything (the endpoint
// here answers nothing). It used to reset the queues and exit 0.
func TestAStrayArgumentIsRefusedBeforeAnyQueueIsTouched(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-prefix", "t-", "oops", "-max-receive", "10"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), `unexpected argument "oops"`) || out.Len() != 0 {
		t.Errorf("status %d, stdout %q, stderr %q; want 2 naming the stray argument, nothing done", code, out.String(), errb.String())
	}
}
