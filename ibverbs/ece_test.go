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

// eceProg calls the ECE functions of librdmacm as rdma-core's cma.c
// answers them with a kernel whose CM carries no ECE: EINVAL for the
// arguments rdma-core refuses, else 0 and no remote options.
const eceProg = `#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static int bad(const char *what) { printf("ERROR %s (errno %d)\n", what, errno); return 1; }

int main(void) {
	struct rdma_cm_id id;
	memset(&id, 0, sizeof id);
	struct ibv_ece e = { .vendor_id = 0x15b3, .options = 7 };
	if (rdma_set_local_ece(&id, &e))
		return bad("rdma_set_local_ece");
	struct ibv_ece r;
	memset(&r, 0xff, sizeof r);
	if (rdma_get_remote_ece(&id, &r) || r.vendor_id || r.options || r.comp_mask)
		return bad("rdma_get_remote_ece");
	struct ibv_ece z = { .options = 1 }, m = { .vendor_id = 1, .comp_mask = 1 };
	errno = 0;
	if (rdma_set_local_ece(&id, &z) != -1 || errno != EINVAL)
		return bad("rdma_set_local_ece vendor_id 0");
	errno = 0;
	if (rdma_set_local_ece(&id, &m) != -1 || errno != EINVAL)
		return bad("rdma_set_local_ece comp_mask");
	errno = 0;
	if (rdma_set_local_ece(&id, NULL) != -1 || errno != EINVAL)
		return bad("rdma_set_local_ece NULL");
	errno = 0;
	if (rdma_get_remote_ece(NULL, &r) != -1 || errno != EINVAL)
		return bad("rdma_get_remote_ece NULL id");
	id.qp = (struct ibv_qp *)&id; /* an ID with a QP of its own */
	errno = 0;
	if (rdma_set_local_ece(&id, &e) != -1 || errno != EINVAL)
		return bad("rdma_set_local_ece with a QP");
	errno = 0;
	if (rdma_get_remote_ece(&id, &r) != -1 || errno != EINVAL)
		return bad("rdma_get_remote_ece with a QP");
	printf("OK\n");
	return 0;
}
`

// TestECEAsRdmaCore: rdma_set_local_ece and rdma_get_remote_ece answer as
// rdma-core's librdmacm does without ECE in the kernel's CM (not ENOSYS
// or EOPNOTSUPP).
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
