package ibverbs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// TestABIHeaderCopy: src/vrnic_abi.h is the ABI header (go generate).
func TestABIHeaderCopy(t *testing.T) {
	want, err := os.ReadFile("../abi/vrnic_abi.h")
	require.NoError(t, err)
	got, err := os.ReadFile("src/vrnic_abi.h")
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got), "run go generate ./ibverbs")
}

// TestBuildExportsTheSystemInterface builds the library and checks that
// it exports exactly the versioned symbols of the system's libibverbs,
// with the same default/compat binding, and that a second Build reuses
// the cache.
func TestBuildExportsTheSystemInterface(t *testing.T) {
	testenv.NeedTool(t, "cc")
	sys, err := SystemLibrary()
	testenv.Need(t, err == nil, "no system libibverbs.so.1")
	cache := t.TempDir()
	dir, err := Build(Options{CacheDir: cache})
	require.NoError(t, err)
	want, err := ReadSymbols(sys)
	require.NoError(t, err)
	got, err := ReadSymbols(filepath.Join(dir, LibName))
	require.NoError(t, err)
	assert.Equal(t, want.Nodes, got.Nodes)
	type key struct {
		name, version string
		def, fn       bool
	}
	set := func(s *SymbolSet) map[key]bool {
		m := map[key]bool{}
		for _, y := range s.Symbols {
			m[key{y.Name, y.Version, y.Default, y.Func}] = true
		}
		return m
	}
	assert.Equal(t, set(want), set(got))

	// The verbs programs use are implemented, not stubs.
	stubs, err := os.ReadFile(filepath.Join(dir, "stubs_gen.c"))
	require.NoError(t, err)
	for _, name := range []string{"ibv_get_device_list", "ibv_open_device", "ibv_reg_mr", "ibv_create_qp",
		"ibv_modify_qp", "ibv_create_comp_channel", "ibv_get_cq_event", "ibv_query_gid_type", "_ibv_query_gid_ex"} {
		assert.NotContains(t, string(stubs), "VR_STUB_INT("+name+")")
		assert.NotContains(t, string(stubs), "VR_STUB_PTR("+name+")")
	}

	// librdmacm: the system's interface too, the rdma_cm calls real.
	if cmSys := SystemCMLibrary(); cmSys != "" {
		want, err := ReadSymbols(cmSys)
		require.NoError(t, err)
		got, err := ReadSymbols(filepath.Join(dir, CMLibName))
		require.NoError(t, err)
		assert.Equal(t, want.Nodes, got.Nodes)
		assert.Equal(t, set(want), set(got))
		stubs, err := os.ReadFile(filepath.Join(dir, "rdmacm_stubs_gen.c"))
		require.NoError(t, err)
		assert.Contains(t, string(stubs), "errno = ENOSYS; return -1;")
		for _, name := range []string{"rsocket", "rbind", "rlisten", "raccept", "rconnect", "rshutdown", "rclose",
			"rrecv", "rrecvfrom", "rrecvmsg", "rsend", "rsendto", "rsendmsg", "rread", "rreadv", "rwrite", "rwritev",
			"rselect", "rgetpeername", "rgetsockname", "rsetsockopt", "rgetsockopt", "rfcntl", "riomap", "riounmap",
			"riowrite",
			"rdma_create_event_channel", "rdma_create_id", "rdma_resolve_addr",
			"rdma_resolve_route", "rdma_bind_addr", "rdma_listen", "rdma_connect", "rdma_accept", "rdma_reject",
			"rdma_disconnect", "rdma_create_qp", "rdma_create_qp_ex", "rdma_create_ep", "rdma_get_request",
			"rdma_get_cm_event", "rdma_ack_cm_event", "rdma_getaddrinfo", "rdma_set_option", "rdma_init_qp_attr",
			"rdma_migrate_id", "rdma_event_str", "rdma_establish", "rpoll", "rdma_set_local_ece", "rdma_get_remote_ece"} {
			assert.NotContains(t, string(stubs), "VR_STUB_INT("+name+")")
			assert.NotContains(t, string(stubs), "VR_STUB_PTR("+name+")")
		}
	}

	again, err := Build(Options{CacheDir: cache})
	require.NoError(t, err)
	assert.Equal(t, dir, again)
	entries, err := os.ReadDir(cache)
	require.NoError(t, err)
	assert.Len(t, entries, 1)
}

func TestGenerate(t *testing.T) {
	set := &SymbolSet{Path: "test", Nodes: []string{"V_1.0", "V_1.1", "V_PRIVATE_1"}, Symbols: []Symbol{
		{Name: "f", Version: "V_1.0", Func: true},
		{Name: "f", Version: "V_1.1", Default: true, Func: true},
		{Name: "g", Version: "V_1.1", Default: true, Func: true},
		{Name: "p", Version: "V_1.1", Default: true, Func: true},
		{Name: "obj", Version: "V_PRIVATE_1", Default: true, Size: 4},
	}}
	stubs, script := Generate(set, map[string]bool{"f": true}, "struct x *p(int);\n")
	s := string(stubs)
	assert.Contains(t, s, "VR_STUB_INT(vrnic_compat_0)\n__asm__(\".symver vrnic_compat_0, f@V_1.0\");")
	assert.Contains(t, s, "VR_STUB_INT(g)")
	assert.Contains(t, s, "VR_STUB_PTR(p)")
	assert.Contains(t, s, "unsigned char obj[4];")
	assert.NotContains(t, s, "VR_STUB_INT(f)")
	want := "V_1.0 {\n};\nV_1.1 {\n\tglobal:\n\t\tf;\n\t\tg;\n\t\tp;\n} V_1.0;\nV_PRIVATE_1 {\n\tglobal:\n\t\tobj;\n\tlocal: *;\n};\n"
	assert.Equal(t, want, string(script))
	assert.True(t, strings.HasPrefix(s, "/* Generated"))
}
