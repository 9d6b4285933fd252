package cashback

import (
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/rewards/cashback/terms"
)

func TestRateRulesValidate(t *testing.T) {
	t.Parallel()
	for _, ok := range []RateRules{{MaxBP: DefaultMaxRateBP, MinLead: DefaultRateMinLead}, {MaxBP: 0, MinLead: time.Nanosecond}, {MaxBP: terms.MaxRateBP, MinLead: time.Hour}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v refused: %v", ok, err)
		}
	}
	for _, bad := range []RateRules{{MaxBP: 1000}, {MaxBP: 1000, MinLead: -time.Second}, {MaxBP: -1, MinLead: time.Minute}, {MaxBP: terms.MaxRateBP + 1, MinLead: time.Minute}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
