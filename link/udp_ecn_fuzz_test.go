package link

import "testing"

// FuzzCmsgECN: any control-message bytes are walked without a panic and
// give an ECN field of two bits at most; a CE answer marks a frame.
func FuzzCmsgECN(f *testing.F) {
	f.Add([]byte{17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Add(make([]byte, 48))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, ok := cmsgECN(b)
		if !ok && e != 0 || e > 3 {
			t.Fatalf("cmsgECN = %d, %v", e, ok)
		}
		frame := make([]byte, udpMinPayload)
		if markCE(frame, b) != (ok && e == ecnCE) || (frame[4]&bthFECN != 0) != (ok && e == ecnCE) {
			t.Fatalf("markCE disagrees with cmsgECN (%d, %v)", e, ok)
		}
	})
}
