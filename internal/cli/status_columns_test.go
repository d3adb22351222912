package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestWriteStatusQuarantinedAndExpired: the provider table of `caddy
// pingback status` counts quarantined results in a column of their own,
// and expired ones in another when the status carries that state (a
// Caddy with max_age), none otherwise.
func TestWriteStatusQuarantinedAndExpired(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 39, 2, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		records map[string]map[store.State]int64
		want    string
	}{
		{"quarantined", map[string]map[store.State]int64{"2captcha": {store.StateDelivered: 2, store.StateQuarantined: 3}},
			`PROVIDER  STORED  DELIVERED  FAILED  REJECTED  PARKED  QUARANTINED  PENDING TASKS  UNPOLLABLE  OLDEST PENDING  LAST PINGBACK
2captcha  5       2          0       0         0       3            0              0           -               -
`},
		{"expired carried", map[string]map[store.State]int64{
			"2captcha":  {store.StateDelivered: 2, store.StateQuarantined: 1, "expired": 4},
			"capsolver": {store.StateParked: 1},
		}, `PROVIDER   STORED  DELIVERED  FAILED  REJECTED  PARKED  QUARANTINED  EXPIRED  PENDING TASKS  UNPOLLABLE  OLDEST PENDING  LAST PINGBACK
2captcha   7       2          0       0         0       1            4        0              0           -               -
capsolver  1       0          0       0         1       0            0        0              0           -               -
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if err := writeStatus(&out, adminapi.StatusAnswer{Records: tc.records, Loops: map[string]adminapi.LoopStatus{}}, now); err != nil {
				t.Fatal(err)
			}
			if got, _, _ := strings.Cut(out.String(), "loop replay"); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}
