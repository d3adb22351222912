package pingback

import (
	"os"
	"strconv"
	"time"

	"github.com/caddy-pingback/pingback/internal/drill"
)

// drillScaleEnv is the environment variable through which `caddy pingback
// drill` tells the child Caddy it starts that the config's timers were
// scaled down by this factor (a number in (0, 1)). Only that child honours
// it, for the drill's sandbox config: it lowers the validated minimums and
// the plugin's fixed timers (the poll loop's tick, the automatic "after"
// bounds, the provider back-off floor) by the same factor, so a scaled
// config still validates. A config alone can never lower a minimum.
const drillScaleEnv = drill.ScaleEnv

// drillTimerScale returns the timer scale of the drill's child, or 1.
func drillTimerScale() float64 {
	v := os.Getenv(drillScaleEnv)
	if v == "" {
		return 1
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0 && f < 1) {
		return 1
	}
	return f
}

// drillScaled scales d by the drill's timer scale, never below floor (nor
// above d).
func drillScaled(d, floor time.Duration) time.Duration {
	return drill.Scaled(drillTimerScale(), d, floor)
}

// Timers of the plugin as the drill's child scales them; each is the
// plain constant outside the drill.
func minPollInterval() time.Duration      { return drillScaled(MinPollInterval, 50*time.Millisecond) }
func autoAfterLow() time.Duration         { return drillScaled(autoAfterMin, 100*time.Millisecond) }
func autoAfterHigh() time.Duration        { return drillScaled(autoAfterMax, 100*time.Millisecond) }
func pollTick() time.Duration             { return drillScaled(time.Second, 100*time.Millisecond) }
func providerBackoffFloor() time.Duration { return drillScaled(5*time.Second, time.Second) }
