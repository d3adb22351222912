package badgerstore

import (
	"strings"

	"go.uber.org/zap"
)

// badgerLogger adapts zap to badger.Logger. Badger logs compaction and
// replay chatter at INFO, so Infof is demoted to Debug.
type badgerLogger struct{ s *zap.SugaredLogger }

func newBadgerLogger(l *zap.Logger) badgerLogger {
	if l == nil {
		l = zap.NewNop()
	}
	return badgerLogger{s: l.Sugar()}
}

func (l badgerLogger) Errorf(f string, a ...any)   { l.s.Errorf(strings.TrimSpace(f), a...) }
func (l badgerLogger) Warningf(f string, a ...any) { l.s.Warnf(strings.TrimSpace(f), a...) }
func (l badgerLogger) Infof(f string, a ...any)    { l.s.Debugf(strings.TrimSpace(f), a...) }
func (l badgerLogger) Debugf(f string, a ...any)   { l.s.Debugf(strings.TrimSpace(f), a...) }
