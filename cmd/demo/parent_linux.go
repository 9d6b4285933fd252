//go:build linux

package main

import "syscall"

// exitWithParent has the kernel send this process SIGTERM when its parent
// dies: `go run` exits on a SIGTERM of its own without passing it on, and
// the demo must not outlive it holding the services (it stops them on
// SIGTERM like on Ctrl-C).
func exitWithParent() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0)
}
