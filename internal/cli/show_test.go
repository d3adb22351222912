package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestPrintRecordSaysWhatHolds: `caddy pingback show` prints held,
// expired and an erased payload when the admin API says so, and none of
// those lines for a record they do not apply to.
func TestPrintRecordSaysWhatHolds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rec     store.Record
		want    []string
		wantNot []string
	}{
		{"plain", store.Record{Provider: "2captcha", ID: "1"}, nil, []string{"held:", "expired:", "payload:"}},
		{"held", store.Record{Provider: "2captcha", ID: "2", Held: true}, []string{"held:", "its provider is paused"}, []string{"expired:", "payload:"}},
		{"expired", store.Record{Provider: "2captcha", ID: "3", Delivery: store.Delivery{State: store.StateExpired, ExpiredReason: "max_age"}},
			[]string{"expired:", "max_age"}, []string{"held:", "payload:"}},
		{"erased", store.Record{Provider: "2captcha", ID: "4", PayloadErased: true}, []string{"payload:", "erased (keep_payload)"}, []string{"held:", "expired:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			cmd := &cobra.Command{}
			cmd.SetOut(&out)
			printRecord(&client{cmd: cmd}, &tc.rec)
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("show printed\n%s\nwant %q in it", out.String(), w)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(out.String(), w) {
					t.Errorf("show printed\n%s\nwant no %q", out.String(), w)
				}
			}
		})
	}
}
