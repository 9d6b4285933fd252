package cashback

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestSlowHookHoldsOnlyTheNamedEventsAndDoesNotFailThem(t *testing.T) {
	slow, other := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	h, err := ParseFailHook("", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SetSlow(slow.String() + "@50ms"); err != nil {
		t.Fatal(err)
	}
	if !h.Armed() {
		t.Error("a slow hook is not reported armed")
	}
	start := time.Now()
	if err := h.Check(slow); err != nil {
		t.Errorf("slow event failed: %v", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("slow event held %v, want at least 50ms", d)
	}
	start = time.Now()
	if err := h.Check(other); err != nil || time.Since(start) > 40*time.Millisecond {
		t.Errorf("another event: err %v after %v; want nil at once", err, time.Since(start))
	}
	for _, bad := range []string{"not-a-uuid@1s", slow.String(), slow.String() + "@soon", slow.String() + "@-1s"} {
		if err := h.SetSlow(bad); err == nil {
			t.Errorf("SetSlow(%q) accepted", bad)
		}
	}
}
