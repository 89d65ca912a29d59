package ibverbs

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// eceProg calls the ECE functions of librdmacm as far as they need no
// device: rdma-core's EINVAL for a NULL ID or ece (tests/ibverbs'
// rdmacm_ece.c covers the rest on real IDs and connections).
const eceProg = `#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static int bad(const char *what) { printf("ERROR %s (errno %d)\n", what, errno); return 1; }

int main(void) {
	struct ibv_ece e = { .vendor_id = 0x1ded, .options = 1 }, r;
	errno = 0;
	if (rdma_set_local_ece(NULL, &e) != -1 || errno != EINVAL)
		return bad("rdma_set_local_ece NULL id");
	errno = 0;
	if (rdma_get_remote_ece(NULL, &r) != -1 || errno != EINVAL)
		return bad("rdma_get_remote_ece NULL id");
	printf("OK\n");
	return 0;
}
`

// TestECEAsRdmaCore: rdma_set_local_ece and rdma_get_remote_ece exist
// and check their arguments as rdma-core's librdmacm does (not ENOSYS or
// EOPNOTSUPP); tests/ibverbs runs them on IDs and connections.
func TestECEAsRdmaCore(t *testing.T) {
	testenv.NeedTool(t, "cc")
	testenv.Need(t, SystemCMLibrary() != "", "no system librdmacm.so.1")
	dir, err := Build(Options{CacheDir: t.TempDir()})
	require.NoError(t, err)
	tmp := t.TempDir()
	src := filepath.Join(tmp, "ece.c")
	require.NoError(t, os.WriteFile(src, []byte(eceProg), 0o644))
	bin := filepath.Join(tmp, "ece")
	out, err := exec.Command("cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", src, "-o", bin,
		filepath.Join(dir, CMLibName), filepath.Join(dir, LibName)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "OK\n", string(out))
}
