//go:build !linux

package testenv

import (
	"errors"
	"syscall"
)

// childAttr: without Linux's parent-death signal, servers are stopped by
// Main only; running them as another user is not supported here.
func childAttr(asPostgres bool, _ syscall.Signal) (*syscall.SysProcAttr, error) {
	if asPostgres {
		return nil, errors.New("running as root, which PostgreSQL refuses: run the tests as a normal user or set DATABASE_URL")
	}
	return nil, nil
}

func chownForChild(string, *syscall.SysProcAttr) error { return nil }

// processAlive errs on the side of keeping other processes' clusters.
func processAlive(int) bool { return true }
