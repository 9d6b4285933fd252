//go:build linux

package sysproc

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// ChildAttr returns the process attributes for a server we start: it gets
// deathSig when this process dies (start it with Start, so that "this
// process" is what it means: see Start), so a crashed or killed parent
// leaves no server behind; asPostgres runs it as the postgres system user
// (initdb and postgres refuse to run as root).
func ChildAttr(asPostgres bool, deathSig syscall.Signal) (*syscall.SysProcAttr, error) {
	attr := &syscall.SysProcAttr{Pdeathsig: deathSig}
	if asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, which PostgreSQL refuses, and no postgres user to run it as: %w", err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("postgres user: %w", err)
		}
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return attr, nil
}

// DiesWithParent reports whether children started with ChildAttr's
// attributes are killed when this process dies (true on Linux).
const DiesWithParent = true

// ChownForChild gives path to the user the child runs as, if it differs.
func ChownForChild(path string, attr *syscall.SysProcAttr) error {
	if attr == nil || attr.Credential == nil {
		return nil
	}
	return os.Chown(path, int(attr.Credential.Uid), int(attr.Credential.Gid))
}

// Alive reports whether a process with this pid exists (zombies included:
// use it for processes that are not our children).
func Alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
