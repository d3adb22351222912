package store

import (
	"context"
	"strings"
	"time"
)

// PayloadEraser erases the payload of results the app has had for long
// enough (keep_payload): what a result carried, as opposed to what the
// store needs to dedupe and account for it.
type PayloadEraser interface {
	// ErasePayloads erases, as one ordinary write, the payload
	// (ErasePayload) of up to limit records in StateDelivered whose
	// delivery (Delivery.UpdatedAt of the delivered record) was at or
	// before before, earliest first, and returns how many it erased. A
	// record whose payload is already erased, or that is in any other
	// state, is left as it is: results not delivered keep their payload.
	// It reads an index of delivered records by delivery time, never the
	// whole store. Records delivered before the store kept that index
	// (Badger stores of earlier versions) keep their payload until their
	// retention ends. limit must be at least 1.
	ErasePayloads(ctx context.Context, before time.Time, limit int) (int, error)
}

// ErasePayload erases r's payload in place: its code, answer and other
// code, the request's body and headers and the query of its URI (the
// path stays, as the route). The key, source, times, state, attempts,
// statuses and history stay, and PayloadErased is set. Every store erases
// exactly these fields.
func ErasePayload(r *Record) {
	r.Code, r.Answer, r.OtherCode = "", nil, ""
	r.Request.Body, r.Request.Header = nil, nil
	r.Request.URI = ErasedURI(r.Request.URI)
	r.PayloadErased = true
}

// ErasedURI is uri (a RequestURI) without its query.
func ErasedURI(uri string) string {
	path, _, _ := strings.Cut(uri, "?")
	return path
}
