package contract_test

import (
	"testing"

	"github.com/effectively-once/payments-cashback/services/contract"
)

// A masked phone keeps the country code and the last four digits only.
func TestMaskPhoneKeepsTheCountryCodeAndLastFourDigitsOnly(t *testing.T) {
	for in, want := range map[string]string{
		"+919876543210": "+91******3210",
		"+14155552671":  "+14*****2671",
		"u_17":          "u_17",
		"+91 98765":     "+91 98765", // not a number: not a phone, left alone
		"+1234":         "+1234",
	} {
		if got := contract.MaskPhone(in); got != want {
			t.Errorf("MaskPhone(%q) = %q, want %q", in, got, want)
		}
	}
}

// Only E.164 numbers are phones: + and 8 to 15 digits, no leading zero.
func TestValidPhoneAcceptsE164Only(t *testing.T) {
	for in, want := range map[string]bool{
		"+919876543210": true, "+14155552671": true,
		"919876543210": false, "+0123456789": false, "+91 98765 43210": false, "+1234567": false, "+1234567890123456": false,
	} {
		if got := contract.ValidPhone(in); got != want {
			t.Errorf("ValidPhone(%q) = %v, want %v", in, got, want)
		}
	}
}

// Inside free text, every phone number is masked as MaskPhone masks one,
// in whatever grouping it is written; short numbers (a status, an IP
// address, a date) are left readable.
func TestMaskPhonesMasksEveryNumberInAText(t *testing.T) {
	for in, want := range map[string]string{
		`{"error":"invalid destination +919800000017"}`: `{"error":"invalid destination +91******0017"}`,
		"919800000017 is not reachable":                 "91******0017 is not reachable",
		"to +91 98000-00017, then +14155552671":         "to +91 *****-*0017, then +14*****2671",
		"call (980) 000 0017":                           "call (98*) *** 0017",
		"503 Service Unavailable from 10.100.200.150":   "503 Service Unavailable from 10.100.200.150",
		"sms_000001 on 2026-12-07":                      "sms_000001 on 2026-12-07",
		"no number here":                                "no number here",
	} {
		if got := contract.MaskPhones(in); got != want {
			t.Errorf("MaskPhones(%q) = %q, want %q", in, got, want)
		}
	}
	if got, want := contract.MaskPhones("+919800000017"), contract.MaskPhone("+919800000017"); got != want {
		t.Errorf("MaskPhones of a bare recipient = %q, MaskPhone = %q: want them equal", got, want)
	}
}
