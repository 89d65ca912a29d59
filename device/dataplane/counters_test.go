package dataplane

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/engine"
)

// The engine's atomic counters (the QP's and its rare block) are the
// operator's counters: every one of them, none more.
func TestCountersMirror(t *testing.T) {
	e, r := reflect.TypeFor[engine.QPCounters](), reflect.TypeFor[engine.RareQPCounters]()
	names := map[string]bool{}
	for _, typ := range []reflect.Type{e, r} {
		for i := range typ.NumField() {
			if typ.Field(i).IsExported() {
				names[typ.Field(i).Name] = true
			}
		}
	}
	o := reflect.TypeFor[device.QPCounters]()
	require.Len(t, names, o.NumField())
	for i := range o.NumField() {
		assert.True(t, names[o.Field(i).Name], "%s is not an engine counter", o.Field(i).Name)
	}
}

func TestCountersOf(t *testing.T) {
	var c engine.QPCounters
	assert.Equal(t, device.QPCounters{}, countersOf(&c), "a QP that counted no error")
	o := reflect.TypeFor[device.QPCounters]()
	hot, rare := reflect.ValueOf(&c).Elem(), reflect.ValueOf(c.Rare()).Elem()
	for i := range o.NumField() {
		f := hot.FieldByName(o.Field(i).Name)
		if !f.IsValid() {
			f = rare.FieldByName(o.Field(i).Name)
		}
		f.Addr().MethodByName("Store").Call([]reflect.Value{reflect.ValueOf(uint64(100 + i))})
	}
	got := reflect.ValueOf(countersOf(&c))
	for i := range got.NumField() {
		assert.Equal(t, uint64(100+i), got.Field(i).Uint(), got.Type().Field(i).Name)
	}
	assert.Equal(t, device.QPCounters{}, countersOf(nil))
}
