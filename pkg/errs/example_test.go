package errs_test

import (
	"errors"
	"fmt"
	"net/http/httptest"

	"github.com/effectively-once/payments-cashback/pkg/errs"
)

// A handler marks what no retry can fix; transports park such messages
// instead of redelivering them. The mark survives wrapping.
func ExamplePermanent() {
	err := fmt.Errorf("handle pay_42: %w", errs.Permanent(errors.New("amount_paise must be positive")))
	fmt.Println(errs.IsPermanent(err), errs.IsPermanent(errors.New("connection reset")))
	// Output:
	// true false
}

// Every error response has one JSON shape, with no internal error text.
func ExampleWrite() {
	w := httptest.NewRecorder()
	errs.Write(w, 422, "idempotency_key_reused", "Idempotency-Key", "this key was used with another request body")
	fmt.Print(w.Code, " ", w.Body.String())
	// Output:
	// 422 {"error":{"code":"idempotency_key_reused","field":"Idempotency-Key","message":"this key was used with another request body"}}
}
