package testenv

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// recorder is a testing.TB that records Skip and Fatal instead of ending
// the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Skip(args ...any)                  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestNeed(t *testing.T) {
	for _, ci := range []string{"", "false", "1", "true"} {
		t.Run("CI="+ci, func(t *testing.T) {
			t.Setenv("CI", ci)
			assert.Equal(t, ci == "true", InCI())

			var met recorder
			Need(&met, true, "a reason")
			assert.Empty(t, met.skipped)
			assert.Empty(t, met.failed)

			var unmet recorder
			Need(&unmet, false, "a reason")
			if ci == "true" {
				assert.Empty(t, unmet.skipped)
				assert.Contains(t, unmet.failed, "a reason")
				assert.Contains(t, unmet.failed, "CI=true")
			} else {
				assert.Equal(t, "a reason", unmet.skipped)
				assert.Empty(t, unmet.failed)
			}
		})
	}
}

func TestNeedTool(t *testing.T) {
	t.Setenv("CI", "")
	var r recorder
	assert.NotEmpty(t, NeedTool(&r, "sh"))
	assert.Empty(t, r.skipped)

	r = recorder{}
	assert.Empty(t, NeedTool(&r, "vrnic-no-such-tool"))
	assert.Contains(t, r.skipped, "vrnic-no-such-tool not installed")

	t.Setenv("CI", "true")
	r = recorder{}
	NeedTool(&r, "vrnic-no-such-tool")
	assert.Empty(t, r.skipped)
	assert.Contains(t, r.failed, "vrnic-no-such-tool not installed")
}

func TestNeedRoot(t *testing.T) {
	defer func(f func() int) { geteuid = f }(geteuid)
	for _, uid := range []int{0, 1000} {
		geteuid = func() int { return uid }
		for _, ci := range []string{"", "true"} {
			t.Run(fmt.Sprintf("euid=%d/CI=%s", uid, ci), func(t *testing.T) {
				t.Setenv("CI", ci)
				assert.Equal(t, uid == 0, IsRoot())
				var r recorder
				NeedRoot(&r, "needs root for a reason")
				switch {
				case uid == 0:
					assert.Empty(t, r.skipped)
					assert.Empty(t, r.failed)
				case ci == "true":
					assert.Empty(t, r.skipped)
					assert.Contains(t, r.failed, "needs root for a reason")
				default:
					assert.Equal(t, "needs root for a reason", r.skipped)
					assert.Empty(t, r.failed)
				}
				r = recorder{}
				NeedRoot(&r, "")
				if uid != 0 && ci == "" {
					assert.Equal(t, "needs root", r.skipped)
				}
			})
		}
	}
}
