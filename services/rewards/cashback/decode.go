package cashback

import "github.com/effectively-once/payments-cashback/pkg/events"

// DecodeSucceeded reads and checks a PaymentSucceeded payload as rewards
// does (ids, user, a positive amount in INR), for other consumers of the
// same event. Its errors are permanent: no redelivery changes the payload.
func DecodeSucceeded(e events.Envelope) (PaymentPayload, error) { return decodePayment(e, true) }
