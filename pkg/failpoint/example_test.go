package failpoint_test

import (
	"fmt"

	"github.com/effectively-once/payments-cashback/pkg/failpoint"
)

// A test arms a step in-process; the code under test abandons its work
// there as a crash would.
func ExampleEnable() {
	step := func() string {
		if failpoint.Hit(failpoint.AfterPublishBeforeMark) {
			return "crashed before marking"
		}
		return "marked"
	}
	fmt.Println(step())
	disable := failpoint.Enable(failpoint.AfterPublishBeforeMark, 1)
	fmt.Println(step())
	disable()
	fmt.Println(step())
	// Output:
	// marked
	// crashed before marking
	// marked
}
