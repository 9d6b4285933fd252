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
