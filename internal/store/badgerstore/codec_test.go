package badgerstore

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// fill sets every field reachable from v (exported or not, however deep)
// to a value of its own that is not the zero value, so that a round trip
// that drops or mixes up any field fails. A kind it does not know fails
// the test: teach it the new kind, then the codec.
func fill(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	*n++
	switch {
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Unix(1_700_000_000+int64(*n)*3607, int64(*n)*1_000_003).UTC()))
		return
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8:
		// A JSON string literal, so that json.RawMessage fields fill too.
		v.SetBytes([]byte(fmt.Sprintf("%q", fmt.Sprint("bytes-", *n))))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprint("s", *n))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Field(i)
			if !f.CanSet() {
				t.Fatalf("fill: unexported field %s.%s cannot be stored by any encoder", v.Type(), v.Type().Field(i).Name)
			}
			fill(t, f, n)
		}
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(t, p.Elem(), n)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(t, s.Index(i), n)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(t, k, n)
			fill(t, e, n)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	default:
		t.Fatalf("fill: no value for a %s (%s)", v.Kind(), v.Type())
	}
}

// filled returns a *T with every field set.
func filled[T any](t *testing.T) *T {
	t.Helper()
	x := new(T)
	n := 0
	fill(t, reflect.ValueOf(x).Elem(), &n)
	return x
}

// Every field of Record, Delivery and Task survives the binary encoding,
// and the JSON of format 2 still decodes. A field added to one of these
// structs and not to the binary encoding (its layouts and field lists,
// such as [recordLayout] and [recordFields]) fails here (and, until it
// is added, the store writes that type as JSON, so the field is kept).
func TestCodecRoundTrip(t *testing.T) {
	for _, c := range []struct {
		typ    reflect.Type
		fields []string
	}{
		{reflect.TypeFor[store.Record](), recordFields},
		{reflect.TypeFor[store.Delivery](), deliveryFields},
		{reflect.TypeFor[store.Task](), taskFields},
	} {
		if err := binaryCovers(c.typ, c.fields); err != nil {
			t.Errorf("%v: add them to the binary encoding in badger_codec.go (and to its field list)", err)
		}
	}

	t.Run("record", func(t *testing.T) {
		full := filled[store.Record](t)
		full.Held = false // computed when shown, never stored
		for name, r := range map[string]*store.Record{"filled": full, "zero": {}} {
			b, err := encodeRecord(r)
			if err != nil {
				t.Fatal(err)
			}
			if b[0] != tagRecord1 {
				t.Errorf("%s: encoded with tag %#x, want the binary %#x", name, b[0], tagRecord1)
			}
			roundTrip(t, name+" binary", r, b, decodeRecord)
			js, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, name+" format 2 JSON", r, js, decodeRecord)
		}
	})
	t.Run("delivery", func(t *testing.T) {
		for name, d := range map[string]*store.Delivery{"filled": filled[store.Delivery](t), "zero": {}} {
			b := encodeDelivery(d)
			if b[0] != tagDelivery1 {
				t.Errorf("%s: encoded with tag %#x, want the binary %#x", name, b[0], tagDelivery1)
			}
			roundTrip(t, name+" binary", d, b, decodeDelivery)
			js, _ := json.Marshal(d)
			roundTrip(t, name+" format 2 JSON", d, js, decodeDelivery)
		}
	})
	t.Run("task", func(t *testing.T) {
		for name, x := range map[string]*store.Task{"filled": filled[store.Task](t), "zero": {}} {
			b, err := encodeTask(x)
			if err != nil {
				t.Fatal(err)
			}
			if b[0] != tagTask1 {
				t.Errorf("%s: encoded with tag %#x, want the binary %#x", name, b[0], tagTask1)
			}
			roundTrip(t, name+" binary", x, b, decodeTask)
			js, _ := json.Marshal(x)
			roundTrip(t, name+" format 2 JSON", x, js, decodeTask)
			// A value written before ResultAt was added (format 3 as first
			// shipped) ends without it and reads with it zero.
			old := *x
			old.ResultAt, old.Token, old.Account = time.Time{}, "", ""
			ob, _ := encodeTask(&old)
			roundTrip(t, name+" binary without result_at", &old, ob[:len(ob)-3], decodeTask)
			// Nor, before that, the token (appended after result_at).
			old = *x
			old.Token, old.Account = "", ""
			ob, _ = encodeTask(&old)
			roundTrip(t, name+" binary without token", &old, ob[:len(ob)-2], decodeTask)
			// Nor, before format 7, the account (appended after the
			// token).
			old = *x
			old.Account = ""
			ob, _ = encodeTask(&old)
			roundTrip(t, name+" binary without account", &old, ob[:len(ob)-1], decodeTask)
		}
	})
}

func roundTrip[T any](t *testing.T, what string, want *T, b []byte, decode func([]byte, *T) error) {
	t.Helper()
	got := new(T)
	if err := decode(b, got); err != nil {
		t.Fatalf("%s: decoding: %v", what, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: round trip changed the value:\n got %+v\nwant %+v", what, got, want)
	}
}

// The decoders never panic, and what they accept encodes back to the same.
func FuzzDecodeRecord(f *testing.F) {
	r := testRecord("1", store.StateForwarding)
	b, _ := encodeRecord(r)
	f.Add(b)
	js, _ := json.Marshal(r)
	f.Add(js)
	f.Add(encodeDelivery(&r.Delivery))
	f.Add([]byte{tagRecord1, 0x80})
	f.Fuzz(func(t *testing.T, v []byte) {
		var rec store.Record
		if err := decodeRecord(v, &rec); err == nil && len(v) > 0 && v[0] == tagRecord1 {
			again, err := encodeRecord(&rec)
			if err != nil {
				t.Fatal(err)
			}
			var rec2 store.Record
			if err := decodeRecord(again, &rec2); err != nil || !reflect.DeepEqual(rec, rec2) {
				t.Fatalf("re-encoding changed %+v into %+v (%v)", rec, rec2, err)
			}
		}
		var d store.Delivery
		_ = decodeDelivery(v, &d)
		var task store.Task
		_ = decodeTask(v, &task)
	})
}

// The delivery state read alone from a record's value (an r/ whose state
// has not changed since it was stored) carries the history appended at
// the record's end.
func TestCodecRecordDeliveryHistory(t *testing.T) {
	r := filled[store.Record](t)
	b, err := encodeRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.History) == 0 {
		t.Fatal("filled record has no history")
	}
	var d store.Delivery
	if err := decodeRecordDelivery(b, &d); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d, r.Delivery) {
		t.Errorf("delivery read alone:\n got %+v\nwant %+v", d, r.Delivery)
	}
}

// Values stored before fields were appended to the encoding decode, with
// those fields zero.
func TestCodecAppendedFields(t *testing.T) {
	r := filled[store.Record](t)
	r.Verified, r.Tracked, r.Quarantine, r.OtherCode, r.Correction = "", false, "", "", false
	r.PayloadErased = false // a flag, written only when set: unset, the layout is the earlier one
	r.ExpiredReason = ""
	r.Held = false // computed when shown, never stored
	vb, err := encodeRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, "record without the appended expired_reason", r, vb[:len(vb)-1], decodeRecord) // one empty string
	roundTrip(t, "record without the appended verification", r, vb[:len(vb)-6], decodeRecord)   // three empty strings, two false more
	r.Answer, r.History = nil, nil
	b, err := encodeRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, "record without the appended history", r, b[:len(b)-7], decodeRecord) // its empty history was one byte, after the verification
	roundTrip(t, "record without the appended answer", r, b[:len(b)-8], decodeRecord)  // and its empty answer one more
	db := encodeDelivery(&r.Delivery)
	roundTrip(t, "delivery without the appended expired_reason", &r.Delivery, db[:len(db)-1], decodeDelivery)
	roundTrip(t, "delivery without the appended history", &r.Delivery, db[:len(db)-2], decodeDelivery)
	task := filled[store.Task](t)
	task.API, task.Server, task.AppPolls, task.AppPolledAt, task.ResultAt, task.Token, task.Account = "", "", 0, time.Time{}, time.Time{}, "", ""
	tb, err := encodeTask(task)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, "task without the appended fields", task, tb[:len(tb)-7], decodeTask) // four empty strings, 0, two zero times
	if err := decodeRecord(b[:len(b)-9], new(store.Record)); err == nil {
		t.Error("a record cut inside its fixed fields decoded without error")
	}
}
