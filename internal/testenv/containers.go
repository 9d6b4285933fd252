package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Containers are PostgreSQL and LocalStack (SQS) started in Docker with
// testcontainers-go: the same servers docker-compose.yml runs.
type Containers struct {
	DatabaseURL string // the postgres maintenance database, as DATABASE_URL
	SQSEndpoint string // LocalStack's edge port, as AWS_ENDPOINT_URL
	stop        []testcontainers.Container
}

// Images the containers run; the versions docker-compose.yml pins.
const (
	PostgresImage   = "postgres:15"
	LocalStackImage = "localstack/localstack:3.8"
)

// StartContainers starts both containers and waits until each serves. It
// needs a Docker engine (DockerAvailable); Terminate removes them.
func StartContainers(ctx context.Context) (*Containers, error) {
	if !DockerAvailable() {
		return nil, fmt.Errorf("no Docker engine: %w", docker.err)
	}
	c := &Containers{}
	pg, err := testcontainers.Run(ctx, PostgresImage,
		testcontainers.WithEnv(map[string]string{"POSTGRES_PASSWORD": "postgres"}),
		testcontainers.WithExposedPorts("5432/tcp"),
		// The entrypoint starts the server twice (init, then for real).
		testcontainers.WithWaitStrategyAndDeadline(2*time.Minute,
			wait.ForLog("database system is ready to accept connections").WithOccurrence(2)))
	if pg != nil {
		c.stop = append(c.stop, pg)
	}
	if err != nil {
		c.Terminate()
		return nil, fmt.Errorf("postgres container: %w", err)
	}
	hostPort, err := pg.PortEndpoint(ctx, "5432/tcp", "")
	if err != nil {
		c.Terminate()
		return nil, err
	}
	c.DatabaseURL = "postgres://postgres:postgres@" + hostPort + "/postgres?sslmode=disable"

	ls, err := testcontainers.Run(ctx, LocalStackImage,
		testcontainers.WithEnv(map[string]string{"SERVICES": "sqs"}),
		testcontainers.WithExposedPorts("4566/tcp"),
		testcontainers.WithWaitStrategyAndDeadline(2*time.Minute,
			wait.ForHTTP("/_localstack/health").WithPort("4566/tcp").WithStatusCodeMatcher(func(s int) bool { return s == 200 })))
	if ls != nil {
		c.stop = append(c.stop, ls)
	}
	if err != nil {
		c.Terminate()
		return nil, fmt.Errorf("localstack container: %w", err)
	}
	if c.SQSEndpoint, err = ls.PortEndpoint(ctx, "4566/tcp", "http"); err != nil {
		c.Terminate()
		return nil, err
	}
	return c, nil
}

// Terminate stops and removes the containers.
func (c *Containers) Terminate() {
	var errs []error
	for _, ct := range c.stop {
		errs = append(errs, testcontainers.TerminateContainer(ct))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: removing containers:", err)
	}
	c.stop = nil
}

// useContainers decides, before the tests run, whether this test process
// gets its PostgreSQL and SQS from containers: TESTENV=containers asks for
// them; with TESTENV unset they are used when Docker is available and
// nothing else was configured (no DATABASE_URL, no AWS endpoint, no
// .stack/env), as on a developer's machine running a plain `go test`.
// TESTENV=local never uses them. Without Docker the answer is no, with the
// reason, and the same tests run on the local stack.
func useContainers() (bool, string) {
	switch os.Getenv("TESTENV") {
	case "local":
		return false, "TESTENV=local"
	case "containers":
	default:
		if dsn, _ := lookup("DATABASE_URL"); dsn != "" {
			return false, "DATABASE_URL is set"
		}
		if ep, _ := lookup("AWS_ENDPOINT_URL"); ep != "" {
			return false, "AWS_ENDPOINT_URL is set"
		}
		if srv, _ := lookup("SQS_SERVER"); srv != "" {
			return false, "SQS_SERVER is set"
		}
	}
	if !DockerAvailable() {
		return false, "no Docker engine (" + docker.err.Error() + ")"
	}
	return true, ""
}

// startContainersForMain is Main's containers path: it points this
// process's DATABASE_URL and AWS_ENDPOINT_URL at fresh containers.
func startContainersForMain() (stop func()) {
	use, why := useContainers()
	if !use {
		if os.Getenv("TESTENV") == "containers" {
			fmt.Fprintf(os.Stderr, "testenv: TESTENV=containers, but %s: using the local stack instead\n", why)
		}
		return func() {}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := StartContainers(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: containers failed (%v): using the local stack instead\n", err)
		return func() {}
	}
	fmt.Fprintf(os.Stderr, "testenv: PostgreSQL and SQS from containers (%s, %s)\n", PostgresImage, LocalStackImage)
	_ = os.Setenv("DATABASE_URL", c.DatabaseURL)
	_ = os.Setenv("AWS_ENDPOINT_URL", c.SQSEndpoint)
	return c.Terminate
}
