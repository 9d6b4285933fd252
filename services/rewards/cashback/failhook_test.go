package cashback

import (
	"errors"
	"testing"

	"github.com/google/uuid"
)

func TestFailHook(t *testing.T) {
	a, b, c := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	h, err := ParseFailHook(a.String()+", "+b.String()+"@2", "1")
	if err != nil {
		t.Fatal(err)
	}
	if !h.Armed() {
		t.Fatal("hook not armed")
	}
	// c: only the first attempt of the process fails (FIRST_N=1).
	if err := h.Check(c); !errors.Is(err, ErrInjected) {
		t.Errorf("first attempt: %v, want ErrInjected", err)
	}
	if err := h.Check(c); err != nil {
		t.Errorf("second attempt of c: %v, want nil", err)
	}
	// b@2: two failures, then success.
	for i := range 2 {
		if err := h.Check(b); !errors.Is(err, ErrInjected) {
			t.Errorf("b attempt %d: %v, want ErrInjected", i+1, err)
		}
	}
	if err := h.Check(b); err != nil {
		t.Errorf("b attempt 3: %v, want nil", err)
	}
	// a: always.
	for range 10 {
		if err := h.Check(a); !errors.Is(err, ErrInjected) {
			t.Fatalf("a: %v, want ErrInjected every time", err)
		}
	}
	if got := h.Injected(); got != 13 {
		t.Errorf("Injected() = %d, want 13", got)
	}

	inert, err := ParseFailHook("", "")
	if err != nil || inert.Armed() || inert.Check(a) != nil {
		t.Errorf("empty configuration: armed=%v err=%v; want an inert hook", inert.Armed(), err)
	}
	var none *FailHook
	if none.Check(a) != nil || none.Armed() {
		t.Error("nil hook must be inert")
	}
	for _, bad := range [][2]string{{"not-a-uuid", ""}, {a.String() + "@0", ""}, {"", "-1"}, {"", "x"}} {
		if _, err := ParseFailHook(bad[0], bad[1]); err == nil {
			t.Errorf("ParseFailHook(%q, %q) accepted", bad[0], bad[1])
		}
	}
}
