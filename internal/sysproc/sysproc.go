// Package sysproc holds what the repo's process supervisors (internal/testenv
// for test servers, internal/stack for the local stack of services) need from
// the operating system: children that die with their parent, run as another
// user when PostgreSQL insists, and a liveness probe by pid.
package sysproc

import (
	"os/exec"
	"runtime"
	"sync"
)

// Start starts cmd like cmd.Start, but forks it from one OS thread that is
// locked for the life of this process.
//
// Why: Linux delivers the parent-death signal (SysProcAttr.Pdeathsig) when
// the *thread* that forked the child exits, not the process. The Go runtime
// keeps its threads, except that a goroutine which exits while locked with
// runtime.LockOSThread takes its thread with it, and any library may do
// that. Forking from a thread that never exits makes the signal mean what it
// says: "this process is gone".
func Start(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawner.reqs <- spawnReq{cmd, done}
	return <-done
}

var spawner struct {
	once sync.Once
	reqs chan spawnReq
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}
