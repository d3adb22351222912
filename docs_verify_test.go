package pingback

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// TestReadmeVerificationFacts: the documentation (README.md and docs/*.md)
// states verification's facts once (the Verification section of
// docs/security.md; its security sections link to it) and with the code's
// values: the token's name, res_php's retries, the quarantine's default caps
// and metric, the release endpoint and the correction key.
func TestReadmeVerificationFacts(t *testing.T) {
	var all strings.Builder
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
		all.WriteString("\n")
	}
	docs := strings.Join(strings.Fields(all.String()), " ") // line breaks do not matter
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
		n := strings.Count(docs, tc.fact)
		if (tc.want < 0 && n == 0) || (tc.want >= 0 && n != tc.want) {
			t.Errorf("the documentation says %q %d times, want %d (-1: at least once)", tc.fact, n, tc.want)
		}
	}
	b, err := os.ReadFile(filepath.Join("docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := strings.Join(strings.Fields(string(b)), " ")
	if !strings.Contains(page, "## Verification: tokens, quarantine, corrections") {
		t.Fatal("docs/security.md has no Verification section")
	}
	start := strings.Index(page, "## Who can reach what")
	if start < 0 {
		t.Fatal("docs/security.md has no security sections (## Who can reach what)")
	}
	if sec := page[start:]; !strings.Contains(sec, "[Verification](#verification-tokens-quarantine-corrections)") {
		t.Error("the security sections of docs/security.md do not link to Verification")
	}
}
