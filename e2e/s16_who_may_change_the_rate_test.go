package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// rawPost is a POST with exactly the Authorization given ("" for none).
func rawPost(t *testing.T, url, auth, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Scenario 16. Who may change the rate: the anonymous request that used to
// make every payment earn 100% cashback is refused against the running
// stack (401), as are the payments client's key (401: another service's)
// and the rewards reader's key (403 naming admin); no rate row is written,
// and the next payment is credited at 2%.
func TestAnAnonymousRateChangeIsRefusedAndTheNextPaymentIsCreditedAtTwoPercent(t *testing.T) {
	ctx := context.Background()
	var before int64
	if err := s.rewDB.QueryRow(ctx, `SELECT count(*) FROM cashback_rates`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	url := s.rewardsURL + "/v1/cashback-rates"
	for _, c := range []struct {
		name, auth string
		want       int
	}{
		{"anonymous", "", http.StatusUnauthorized},
		{"the payments client's key", "Bearer " + s.apiKey, http.StatusUnauthorized},
		{"the rewards reader's key", "Bearer " + s.keys["REWARDS_READ_KEY"], http.StatusForbidden},
	} {
		code, body := rawPost(t, url, c.auth, `{"rate_bp":10000}`)
		if code != c.want {
			t.Errorf("%s: POST /v1/cashback-rates {rate_bp:10000}: %d %s, want %d", c.name, code, body, c.want)
		}
		if c.want == http.StatusForbidden && !strings.Contains(body, `\"admin\"`) {
			t.Errorf("%s: 403 body %s does not name the role admin", c.name, body)
		}
	}
	// Even the operator may not go above the ceiling.
	if code, body := rawPost(t, url, "Bearer "+s.keys["REWARDS_ADMIN_KEY"], `{"rate_bp":10000}`); code != http.StatusUnprocessableEntity {
		t.Errorf("the operator asking for 100%%: %d %s, want 422 (above REWARDS_MAX_RATE_BP)", code, body)
	}
	var after int64
	if err := s.rewDB.QueryRow(ctx, `SELECT count(*) FROM cashback_rates`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("cashback_rates went from %d to %d rows: a refused change was stored", before, after)
	}

	p := pay(t, id("u_e2e16"), 120000)
	c, _ := pipelineOnce(t, p.ID, 2400)
	if c.RateBP != 200 {
		t.Errorf("the next payment was credited at %d bp, want 200", c.RateBP)
	}
}
