package badgerstore

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// The values of r/, s/ and t/ keys. Format 2 stored JSON (a value starts
// with '{'), which stays readable; this version writes a compact binary
// encoding, one tag byte then the fields in a fixed order:
//
//	record   tagRecord1   delivery provider id code source received_at
//	                      submitted_at server request expires_at answer
//	                      (then history, below) verified tracked quarantine
//	                      other_code correction (then the delivery's
//	                      expired_reason, appended later) payload_erased
//	                      (a flag, written only when set)
//	request               method uri host proto remote_addr local_addr tls
//	                      header body
//	delivery tagDelivery1 (stand-alone, s/) or inside a record, without tag:
//	                      state attempts failures interrupts due_at
//	                      lease.owner lease.until last_status last_error
//	                      updated_at
//	  then, appended: history (the delivery's, at the end of the
//	  record's and of the stand-alone delivery's encoding): uvarint count,
//	  each attempt source started_at ended_at status outcome error;
//	  then, appended after the history (the stand-alone delivery's) or
//	  after correction (a record's): expired_reason
//	task     tagTask1     provider id method submitted_at pingback_url
//	                      state next_poll_at polls last_error updated_at
//	                      expires_at api server app_polls app_polled_at
//	                      result_at token account
//
// string and []byte: uvarint length, bytes; int: zig-zag varint; bool: one
// byte; time: 0 for the zero time, else 1, varint Unix seconds, uvarint
// nanoseconds (UTC); header: uvarint count of names, then each name and
// its values (uvarint count, strings), names sorted.
//
// A field added to one of these types is appended at the end of its
// encoding and decoded only when the value goes on (dec.more), so values
// stored before it stay readable.
//
// A struct field the binary encoding does not know (added to Record,
// Delivery or Task without being added here) makes that type fall back to
// JSON, so nothing is dropped; TestCodecRoundTrip fails until the field is
// added here.
const (
	tagRecord1   = 0xB1
	tagDelivery1 = 0xD1
	tagTask1     = 0xC1
)

// Field lists the binary encoding carries, in Go field names, nested
// structs as "Outer.Inner"; binaryCovers compares them with the structs.
var (
	recordFields = []string{"Provider", "ID", "Code", "Source", "ReceivedAt", "SubmittedAt", "Server",
		"Request", "Request.Method", "Request.URI", "Request.Host", "Request.Proto", "Request.RemoteAddr",
		"Request.LocalAddr", "Request.TLS", "Request.Header", "Request.Body", "Delivery", "ExpiresAt", "Answer",
		"Verified", "Tracked", "Quarantine", "OtherCode", "Correction", "PayloadErased",
		"Held"} // Held: computed when shown, never stored (not in recordLayout)
	deliveryFields = []string{"State", "Attempts", "Failures", "Interrupts", "DueAt", "Lease", "Lease.Owner",
		"Lease.Until", "LastStatus", "LastError", "UpdatedAt", "History", "ExpiredReason"}
	taskFields = []string{"Provider", "ID", "Method", "SubmittedAt", "PingbackURL", "State", "NextPollAt",
		"Polls", "LastError", "UpdatedAt", "ExpiresAt", "API", "Server", "AppPolls", "AppPolledAt", "ResultAt",
		"Token", "Account"}
)

// Whether the binary encoding covers every field of each type.
var (
	binaryDelivery = binaryCovers(reflect.TypeFor[store.Delivery](), deliveryFields) == nil
	binaryRecord   = binaryDelivery && binaryCovers(reflect.TypeFor[store.Record](), recordFields) == nil
	binaryTask     = binaryCovers(reflect.TypeFor[store.Task](), taskFields) == nil
)

// binaryCovers reports the fields of t (nested structs other than
// time.Time walked into, embedded Delivery counted as one field) that
// known does not list, or that known lists and t lacks.
func binaryCovers(t reflect.Type, known []string) error {
	var have []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			name := prefix + f.Name
			have = append(have, name)
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Time]() && !f.Anonymous {
				walk(f.Type, name+".")
			}
		}
	}
	walk(t, "")
	var missing, extra []string
	for _, n := range have {
		if !slices.Contains(known, n) {
			missing = append(missing, n)
		}
	}
	for _, n := range known {
		if !slices.Contains(have, n) {
			extra = append(extra, n)
		}
	}
	if len(missing)+len(extra) > 0 {
		return fmt.Errorf("binary encoding of %s: fields not encoded: %s; listed but gone: %s",
			t.Name(), strings.Join(missing, ", "), strings.Join(extra, ", "))
	}
	return nil
}

// encodeRecord encodes r for an r/ value.
func encodeRecord(r *store.Record) ([]byte, error) {
	if !binaryRecord {
		return json.Marshal(r)
	}
	e := enc{b: make([]byte, 0, 256+len(r.Request.Body)+len(r.Answer)+64*len(r.Request.Header))}
	e.b = append(e.b, tagRecord1)
	recordLayout(encFields{&e}, r)
	return e.b, nil
}

// decodeRecord decodes an r/ value of either format.
func decodeRecord(v []byte, r *store.Record) error {
	if len(v) == 0 || v[0] != tagRecord1 {
		return json.Unmarshal(v, r)
	}
	d := dec{b: v[1:]}
	recordLayout(decFields{&d}, r)
	return d.end()
}

// recordLayout is the layout of a record after its tag: its delivery
// first (decodeRecordDelivery reads only it), then the fields appended
// since in the order they were added.
func recordLayout(f fields, r *store.Record) {
	deliveryLayout(f, &r.Delivery)
	f.str(&r.Provider)
	f.str(&r.ID)
	f.str(&r.Code)
	f.str((*string)(&r.Source))
	f.time(&r.ReceivedAt)
	f.time(&r.SubmittedAt)
	f.str(&r.Server)
	q := &r.Request
	f.str(&q.Method)
	f.str(&q.URI)
	f.str(&q.Host)
	f.str(&q.Proto)
	f.str(&q.RemoteAddr)
	f.str(&q.LocalAddr)
	f.bool(&q.TLS)
	f.header(&q.Header)
	f.bytes(&q.Body)
	f.time(&r.ExpiresAt)
	if f.more() { // appended after format 3's first fields
		f.bytes(&r.Answer)
	}
	if f.more() { // appended after Answer
		f.history(&r.History)
	}
	if f.more() { // verification, appended after history
		f.str(&r.Verified)
		f.bool(&r.Tracked)
		f.str(&r.Quarantine)
		f.str(&r.OtherCode)
		f.bool(&r.Correction)
	}
	if f.more() { // the delivery's expired_reason, appended after correction
		f.str(&r.ExpiredReason)
	}
	f.flag(&r.PayloadErased) // appended after expired_reason, only when set
}

// decodeRecordDelivery decodes only the delivery state of an r/ value.
func decodeRecordDelivery(v []byte, x *store.Delivery) error {
	if len(v) == 0 || v[0] != tagRecord1 {
		var r store.Record
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		*x = r.Delivery
		return nil
	}
	d := dec{b: v[1:]}
	deliveryLayout(decFields{&d}, x)
	// The history is at the end: step over the rest without copying it.
	for range 4 { // provider id code source
		d.raw()
	}
	d.time()
	d.time()
	for range 7 { // server method uri host proto remote_addr local_addr
		d.raw()
	}
	d.bool()
	d.skipHeader()
	d.raw() // body
	d.time()
	if d.more() {
		d.raw() // answer
	}
	if d.more() {
		x.History = d.history()
	}
	if d.more() { // verified tracked quarantine other_code correction
		d.raw()
		d.bool()
		d.raw()
		d.raw()
		d.bool()
	}
	if d.more() {
		x.ExpiredReason = d.str()
	}
	return d.err
}

// encodeDelivery encodes d for an s/ value.
func encodeDelivery(d *store.Delivery) []byte {
	if !binaryDelivery {
		b, _ := json.Marshal(d) // a Delivery always encodes
		return b
	}
	e := enc{b: make([]byte, 0, 64+len(d.LastError)+len(d.Lease.Owner))}
	e.b = append(e.b, tagDelivery1)
	deliveryAloneLayout(encFields{&e}, d)
	return e.b
}

// decodeDelivery decodes an s/ value of either format.
func decodeDelivery(v []byte, d *store.Delivery) error {
	if len(v) == 0 || v[0] != tagDelivery1 {
		return json.Unmarshal(v, d)
	}
	x := dec{b: v[1:]}
	deliveryAloneLayout(decFields{&x}, d)
	return x.end()
}

// deliveryAloneLayout is the layout of a stand-alone delivery after its tag:
// its fields, then its history (appended after UpdatedAt).
func deliveryAloneLayout(f fields, d *store.Delivery) {
	deliveryLayout(f, d)
	if f.more() {
		f.history(&d.History)
	}
	if f.more() { // appended after the history
		f.str(&d.ExpiredReason)
	}
}

// deliveryLayout is the layout of a delivery's fields but its history,
// alone or inside a record.
func deliveryLayout(f fields, d *store.Delivery) {
	f.str((*string)(&d.State))
	f.int(&d.Attempts)
	f.int(&d.Failures)
	f.int(&d.Interrupts)
	f.time(&d.DueAt)
	f.str(&d.Lease.Owner)
	f.time(&d.Lease.Until)
	f.int(&d.LastStatus)
	f.str(&d.LastError)
	f.time(&d.UpdatedAt)
}

// encodeTask encodes t for a t/ value.
func encodeTask(t *store.Task) ([]byte, error) {
	if !binaryTask {
		return json.Marshal(t)
	}
	e := enc{b: make([]byte, 0, 128+len(t.PingbackURL)+len(t.LastError))}
	e.b = append(e.b, tagTask1)
	taskLayout(encFields{&e}, t)
	return e.b, nil
}

// decodeTask decodes a t/ value of either format.
func decodeTask(v []byte, t *store.Task) error {
	if len(v) == 0 || v[0] != tagTask1 {
		return json.Unmarshal(v, t)
	}
	d := dec{b: v[1:]}
	taskLayout(decFields{&d}, t)
	return d.end()
}

// taskLayout is the layout of a task after its tag.
func taskLayout(f fields, t *store.Task) {
	f.str(&t.Provider)
	f.str(&t.ID)
	f.str(&t.Method)
	f.time(&t.SubmittedAt)
	f.str(&t.PingbackURL)
	f.str((*string)(&t.State))
	f.time(&t.NextPollAt)
	f.int(&t.Polls)
	f.str(&t.LastError)
	f.time(&t.UpdatedAt)
	f.time(&t.ExpiresAt)
	if f.more() { // appended after format 3's first fields
		f.str(&t.API)
		f.str(&t.Server)
		f.int(&t.AppPolls)
		f.time(&t.AppPolledAt)
	}
	if f.more() { // appended after API, Server, AppPolls, AppPolledAt
		f.time(&t.ResultAt)
	}
	if f.more() { // appended after result_at
		f.str(&t.Token)
	}
	if f.more() { // appended after token (format 7)
		f.str(&t.Account)
	}
}

// attemptLayout is the layout of one attempt of a history.
func attemptLayout(f fields, a *store.Attempt) {
	f.int(&a.Attempt)
	f.str((*string)(&a.Source))
	f.time(&a.StartedAt)
	f.time(&a.EndedAt)
	f.int(&a.Status)
	f.str(&a.Outcome)
	f.str(&a.Error)
}

// fields is one side of the binary encoding, a field at a time: encFields
// writes each field's value, decFields reads the value into the field. Each
// type's layout (recordLayout, deliveryLayout, taskLayout, attemptLayout) is
// written once and serves both sides, so that they cannot disagree.
type fields interface {
	str(p *string)
	bytes(p *[]byte)
	int(p *int)
	bool(p *bool)
	time(p *time.Time)
	header(p *http.Header)
	history(p *[]store.Attempt)
	// flag is an optional trailing bool: encoded only when true, read
	// when the value goes on, so that a value with the flag unset is
	// byte for byte what the layout gave before the flag was added. It
	// must be the layout's last field (a field appended after it writes
	// the flag always, as a bool).
	flag(p *bool)
	// more reports whether the fields appended to a layout later follow:
	// always when encoding (every field is written); when decoding,
	// whether the value goes on (dec.more).
	more() bool
}

// encFields writes fields with e.
type encFields struct{ e *enc }

func (f encFields) str(p *string)              { f.e.str(*p) }
func (f encFields) bytes(p *[]byte)            { f.e.bytes(*p) }
func (f encFields) int(p *int)                 { f.e.int(*p) }
func (f encFields) bool(p *bool)               { f.e.bool(*p) }
func (f encFields) time(p *time.Time)          { f.e.time(*p) }
func (f encFields) header(p *http.Header)      { f.e.header(*p) }
func (f encFields) history(p *[]store.Attempt) { f.e.history(*p) }
func (f encFields) more() bool                 { return true }

func (f encFields) flag(p *bool) {
	if *p {
		f.e.bool(true)
	}
}

// decFields reads fields with d.
type decFields struct{ d *dec }

func (f decFields) str(p *string)              { *p = f.d.str() }
func (f decFields) bytes(p *[]byte)            { *p = f.d.bytes() }
func (f decFields) int(p *int)                 { *p = f.d.int() }
func (f decFields) bool(p *bool)               { *p = f.d.bool() }
func (f decFields) time(p *time.Time)          { *p = f.d.time() }
func (f decFields) header(p *http.Header)      { *p = f.d.header() }
func (f decFields) history(p *[]store.Attempt) { *p = f.d.history() }
func (f decFields) more() bool                 { return f.d.more() }

func (f decFields) flag(p *bool) {
	if f.d.more() {
		*p = f.d.bool()
	}
}

// enc appends the binary encoding.
type enc struct{ b []byte }

func (e *enc) str(s string) {
	e.b = binary.AppendUvarint(e.b, uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *enc) bytes(p []byte) {
	e.b = binary.AppendUvarint(e.b, uint64(len(p)))
	e.b = append(e.b, p...)
}

func (e *enc) int(n int) { e.b = binary.AppendVarint(e.b, int64(n)) }

func (e *enc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

func (e *enc) time(t time.Time) {
	if t.IsZero() {
		e.b = append(e.b, 0)
		return
	}
	e.b = append(e.b, 1)
	e.b = binary.AppendVarint(e.b, t.Unix())
	e.b = binary.AppendUvarint(e.b, uint64(t.Nanosecond()))
}

func (e *enc) header(h http.Header) {
	e.b = binary.AppendUvarint(e.b, uint64(len(h)))
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		e.str(k)
		vs := h[k]
		e.b = binary.AppendUvarint(e.b, uint64(len(vs)))
		for _, v := range vs {
			e.str(v)
		}
	}
}

func (e *enc) history(h []store.Attempt) {
	e.b = binary.AppendUvarint(e.b, uint64(len(h)))
	for i := range h {
		attemptLayout(encFields{e}, &h[i])
	}
}

// dec reads the binary encoding; the first error sticks and every later
// read returns a zero value.
type dec struct {
	b   []byte
	err error
}

var errCorrupt = errors.New("corrupt binary value")

func (d *dec) fail() { d.err, d.b = errCorrupt, nil }

func (d *dec) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) raw() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *dec) str() string { return string(d.raw()) }

// bytes copies: Badger's value is only valid during its callback.
func (d *dec) bytes() []byte {
	p := d.raw()
	if len(p) == 0 {
		return nil
	}
	return append([]byte(nil), p...)
}

func (d *dec) int() int {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

func (d *dec) bool() bool {
	if len(d.b) == 0 {
		d.fail()
		return false
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v == 1
}

func (d *dec) time() time.Time {
	if len(d.b) == 0 {
		d.fail()
		return time.Time{}
	}
	set := d.b[0]
	d.b = d.b[1:]
	if set == 0 {
		return time.Time{}
	}
	sec, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return time.Time{}
	}
	d.b = d.b[n:]
	ns := d.uvarint()
	if ns >= 1e9 {
		d.fail()
		return time.Time{}
	}
	return time.Unix(sec, int64(ns)).UTC()
}

func (d *dec) header() http.Header {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
	}
	if n == 0 || d.err != nil {
		return nil
	}
	h := make(http.Header, n)
	for range n {
		k := d.str()
		m := d.uvarint()
		if m > uint64(len(d.b)) {
			d.fail()
			return nil
		}
		vs := make([]string, m)
		for i := range vs {
			vs[i] = d.str()
		}
		h[k] = vs
	}
	return h
}

func (d *dec) history() []store.Attempt {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
	}
	if n == 0 || d.err != nil {
		return nil
	}
	h := make([]store.Attempt, n)
	for i := range h {
		attemptLayout(decFields{d}, &h[i])
	}
	if d.err != nil {
		return nil
	}
	return h
}

// skipHeader steps over a header without decoding it.
func (d *dec) skipHeader() {
	n := d.uvarint()
	for i := uint64(0); i < n && d.err == nil; i++ {
		d.raw()
		m := d.uvarint()
		for j := uint64(0); j < m && d.err == nil; j++ {
			d.raw()
		}
	}
}

// more reports whether the value goes on: fields added to a type after
// values of it were stored are appended at the end and read only if the
// value has them, so that those values stay readable (their new fields
// are zero).
func (d *dec) more() bool { return d.err == nil && len(d.b) > 0 }

func (d *dec) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = errCorrupt
	}
	return d.err
}
