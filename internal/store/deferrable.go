package store

import "context"

// deferrableKey marks a context whose writes may wait for company.
type deferrableKey struct{}

// Deferrable returns a context whose writes no caller is waiting on (a
// forward's outcome, recorded in the background): a store may hold such a
// write back for a few milliseconds so that it shares the commit, and the
// sync, of the next write someone waits on. It is still durable when the
// call returns; only the return may come a little later.
func Deferrable(ctx context.Context) context.Context {
	return context.WithValue(ctx, deferrableKey{}, true)
}

// IsDeferrable reports whether ctx came from Deferrable.
func IsDeferrable(ctx context.Context) bool {
	v, _ := ctx.Value(deferrableKey{}).(bool)
	return v
}
