// Package units formats quantities for people: byte counts as report,
// record's summary and top print them.
package units

import (
	"fmt"
	"math"
)

// Bytes formats a byte count 1024-based: "512 B", "1.5 MiB". It never
// prints "1024.0" of a unit: that is "1.0" of the next.
func Bytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	const units = "KMGTPE"
	v, i := float64(n)/1024, 0
	for i < len(units)-1 && math.Round(v*10)/10 >= 1024 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, units[i])
}

// SignedBytes is Bytes with a sign: "+1.5 MiB", "-512 B", "0 B".
func SignedBytes(n int64) string {
	switch {
	case n > 0:
		return "+" + Bytes(uint64(n))
	case n < 0:
		return "-" + Bytes(uint64(-n))
	}
	return "0 B"
}
