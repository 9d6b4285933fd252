//go:build !linux

package sysproc

import (
	"errors"
	"syscall"
)

// ChildAttr: without Linux's parent-death signal, children are stopped by
// their supervisor's cleanup only; running them as another user is not
// supported here.
func ChildAttr(asPostgres bool, _ syscall.Signal) (*syscall.SysProcAttr, error) {
	if asPostgres {
		return nil, errors.New("running as root, which PostgreSQL refuses: run as a normal user or set DATABASE_URL")
	}
	return &syscall.SysProcAttr{}, nil
}

// DiesWithParent is false: nothing kills children when this process dies.
const DiesWithParent = false

func ChownForChild(string, *syscall.SysProcAttr) error { return nil }

// Alive errs on the side of keeping other processes' clusters.
func Alive(int) bool { return true }
