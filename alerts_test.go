package pingback

import (
	"os"
	"os/exec"
	"testing"
)

// TestAlertRules checks docs/alerts.yml with promtool (check rules) and
// runs its unit tests on synthetic series (docs/alerts_test.yml). promtool
// comes with the distribution's prometheus package, which .ci/run
// installs; without it the test skips, except in CI (CI set), where it
// fails.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found (install the prometheus package): the alert rules are not checked")
		}
		t.Skip("SKIPPING the alert rule tests: promtool not found (apt-get install prometheus)")
	}
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "docs"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
