// Command healthcheck is the container healthcheck of the project's images,
// which are distroless (no shell, no curl): it GETs a URL and exits 0 when
// the answer is the expected one, 1 otherwise, saying why on stderr. A usage
// error (and -h) exits 1 too: Docker reserves every status but 0 and 1.
//
//	healthcheck [-timeout 3s] [-any] URL
//
// By default only 200 is healthy (a service's /readyz answers 503 until its
// database and queues are reachable); -any accepts any HTTP answer below
// 500, for servers that have no health endpoint (stripe-mock).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	// ContinueOnError: the flag package's own exit on a bad flag is 2 (0
	// for -h), and Docker takes neither as meant.
	flags := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	timeout := flags.Duration("timeout", 3*time.Second, "give up after this long")
	anyStatus := flags.Bool("any", false, "healthy on any HTTP status below 500")
	flags.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: healthcheck [-timeout 3s] [-any] URL")
		flags.PrintDefaults()
	}
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(1) // Parse has printed the error and the usage
	}
	if flags.NArg() != 1 {
		flags.Usage()
		os.Exit(1)
	}
	if err := check(flags.Arg(0), *timeout, *anyStatus); err != nil {
		fmt.Fprintln(os.Stderr, "unhealthy:", err)
		os.Exit(1)
	}
}

func check(url string, timeout time.Duration, anyStatus bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK || (anyStatus && resp.StatusCode < 500) {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Errorf("GET %s: %s %s", url, resp.Status, b)
}
