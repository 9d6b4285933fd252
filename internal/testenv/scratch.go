package testenv

import (
	"fmt"
	"sync"
	"testing"
)

// Scratch is a testing.TB for Example functions, which get none: DB, SQS
// and Queue work with it as in a test. A failure panics (the example then
// fails with the message); done runs the cleanups (drops the database,
// deletes the queues), last registered first.
//
//	func ExampleAdd() {
//		tb, done := testenv.Scratch()
//		defer done()
//		pool := testenv.DB(tb)
//		...
func Scratch() (tb testing.TB, done func()) {
	s := &scratch{}
	return s, s.done
}

type scratch struct {
	testing.TB // nil: only the methods below are called by this package
	mu         sync.Mutex
	cleanups   []func()
}

func (s *scratch) Helper()                   {}
func (s *scratch) Name() string              { return "example" }
func (s *scratch) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (s *scratch) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (s *scratch) Errorf(f string, a ...any) { fmt.Printf("testenv: "+f+"\n", a...) }
func (s *scratch) Logf(f string, a ...any)   {}
func (s *scratch) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

func (s *scratch) done() {
	s.mu.Lock()
	fs := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
