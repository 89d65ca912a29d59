//go:build !race

package queues_test

const raceEnabled = false
