package dataplane

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/engine"
)

// The engine's atomic counters and the operator's counters are the same
// list: same names, same order.
func TestCountersMirror(t *testing.T) {
	e, o := reflect.TypeFor[engine.QPCounters](), reflect.TypeFor[device.QPCounters]()
	require.Equal(t, o.NumField(), e.NumField())
	for i := range e.NumField() {
		assert.Equal(t, o.Field(i).Name, e.Field(i).Name, "field %d", i)
	}
}

func TestCountersOf(t *testing.T) {
	var c engine.QPCounters
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		v.Field(i).Addr().MethodByName("Store").Call([]reflect.Value{reflect.ValueOf(uint64(100 + i))})
	}
	got := reflect.ValueOf(countersOf(&c))
	for i := range got.NumField() {
		assert.Equal(t, uint64(100+i), got.Field(i).Uint(), got.Type().Field(i).Name)
	}
	assert.Equal(t, device.QPCounters{}, countersOf(nil))
}
