package pingback

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// TestReadmeVerificationFacts: the README states verification's facts
// once (the Verification subsection; Security links to it) and with the
// code's values: the token's name, res_php's retries, the quarantine's
// default caps and metric, the release endpoint and the correction key.
func TestReadmeVerificationFacts(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ") // line breaks do not matter
	for _, tc := range []struct {
		fact string
		want int // occurrences: 1 for "said once", -1 for "at least once"
	}{
		{fmt.Sprintf("asked again %d times, %d s apart", confirmTries, confirmGap/time.Second), -1},
		{fmt.Sprintf("`max_quarantine`, default %d results and %d MiB", DefaultMaxQuarantine, DefaultMaxQuarantineBytes>>20), 1},
		{"`" + protocol.TokenParam + "=<32 hex digits>`", 1},
		{protocol.TokenParam + "=" + redactedValue, -1},
		{"`caddy_pingback_quarantine_bytes{provider}`", -1},
		{`callbacks_total{result="quarantine_full"}`, -1},
		{"`Idempotency-Key: <provider>:<id>:correction`", 1},
		{"`POST /pingback/records/<provider>/<id>/release`", -1},
		{"without a token (registered through the admin API", 1}, // where such tasks go
		{"over about 15 s", 0}, // the old, wrong wording
		{"](#verification-tokens-quarantine-corrections)", -1},
	} {
		n := strings.Count(readme, tc.fact)
		if (tc.want < 0 && n == 0) || (tc.want >= 0 && n != tc.want) {
			t.Errorf("README says %q %d times, want %d (-1: at least once)", tc.fact, n, tc.want)
		}
	}
	sec := readme[strings.Index(readme, "## Security"):strings.Index(readme, "## Rehearse before production")]
	if !strings.Contains(sec, "[Verification](#verification-tokens-quarantine-corrections)") {
		t.Error("the Security section does not link to Verification")
	}
}
