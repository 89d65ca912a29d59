/* On-demand paging (ABI 1.4): MRs over the program's virtual memory that
 * the daemon reaches when traffic touches it (process_vm_readv/writev on
 * this process), without copying, pinning or remapping anything at
 * registration; ibv_advise_mr's prefetch. See kernel-notes/odp.md. */
#include "vrnic_ibv.h" /* first: _GNU_SOURCE (struct ucred) */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>

/* Under Yama's ptrace_scope 1 only a process the program names as its
 * ptracer may read its memory: name the daemon, the peer of the control
 * socket (SO_PEERCRED). Scope 0 needs nothing; 2 and 3 refuse anyway
 * (the daemon's attach then fails with EPERM). */
static void allow_daemon(struct vr_ctx *c) {
	FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
	if (!f)
		return;
	int scope = 0;
	if (fscanf(f, "%d", &scope) != 1)
		scope = 0;
	fclose(f);
	if (scope != 1)
		return;
	struct ucred cr;
	socklen_t len = sizeof cr;
	if (getsockopt(c->sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.pid > 0)
		prctl(PR_SET_PTRACER, (unsigned long)cr.pid, 0, 0, 0);
}

/* vr_odp_attach attaches the process to the context once (ODP_ATTACH):
 * the nonce in our memory proves to the daemon that the connection's pid
 * is this process. Returns 0 or the errno of the refusal (kept). */
int vr_odp_attach(struct vr_ctx *c) {
	pthread_mutex_lock(&c->mem_mu);
	int state = c->odp_state;
	if (state == 0) {
		struct vrnic_cmd_odp_attach cmd = { .nonce_addr = (uintptr_t)c->odp_nonce };
		int ret = 0;
		if (getrandom(c->odp_nonce, sizeof c->odp_nonce, 0) != (ssize_t)sizeof c->odp_nonce)
			ret = errno ? errno : EIO;
		if (!ret) {
			memcpy(cmd.nonce, c->odp_nonce, sizeof cmd.nonce);
			allow_daemon(c);
			ret = vr_call(c, VRNIC_CMD_ODP_ATTACH, &cmd, sizeof cmd, NULL, 0, NULL, 0, &c->odp_caps,
				      sizeof c->odp_caps);
		}
		memset(c->odp_nonce, 0, sizeof c->odp_nonce);
		/* A dead daemon is not a refusal: try again on a later call. */
		state = ret ? -ret : 1;
		if (ret != EIO)
			c->odp_state = state;
		if (ret && vr_debug())
			fprintf(stderr, "vrnic: on-demand paging unavailable: %s\n", strerror(ret));
	}
	pthread_mutex_unlock(&c->mem_mu);
	return state == 1 ? 0 : -state;
}

struct ibv_mr *vr_reg_mr_odp(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access) {
	struct vr_ctx *c = vr_ctx(pd->context);
	/* A device without ODP: ib_check_mr_access's EOPNOTSUPP. */
	if (vr_odp_attach(c) || !(c->odp_caps.general_caps & VRNIC_ODP_SUPPORT))
		VR_FAIL_NULL(EOPNOTSUPP);
	struct vrnic_cmd_reg_mr_odp cmd = { .addr = (uintptr_t)addr, .iova = iova, .length = length,
		.pd_handle = pd->handle, .access = access & 0xf };
	if (!addr && length == SIZE_MAX) {
		/* Implicit ODP (mlx5_ib_reg_user_mr): iova 0, and the device
		 * must offer it, else EINVAL. */
		if (iova || !(c->odp_caps.general_caps & VRNIC_ODP_SUPPORT_IMPLICIT))
			VR_FAIL_NULL(EINVAL);
		cmd.length = UINT64_MAX;
		cmd.flags = VRNIC_ODP_F_IMPLICIT;
	} else if (length > VRNIC_MAX_MR_SIZE || (iova & (VR_PAGE - 1)) != ((uintptr_t)addr & (VR_PAGE - 1))) {
		VR_FAIL_NULL(EINVAL);
	}
	struct vr_mr *mr = calloc(1, sizeof *mr);
	if (!mr)
		VR_FAIL_NULL(ENOMEM);
	struct vrnic_resp_reg_mr r;
	int ret = vr_call(c, VRNIC_CMD_REG_MR_ODP, &cmd, sizeof cmd, NULL, 0, NULL, 0, &r, sizeof r);
	if (ret) {
		free(mr);
		VR_FAIL_NULL(ret);
	}
	return vr_mr_init(mr, pd, addr, length, &r, mr->access);
}

/* ibv_advise_mr: the daemon checks and prefetches (ADVISE_MR); errors as
 * the kernel's (ib_uverbs_advise_mr, mlx5_ib_advise_mr). */
int vr_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags, struct ibv_sge *sg_list,
		 uint32_t num_sge) {
	if (!pd || (num_sge && !sg_list)) {
		errno = EINVAL;
		return EINVAL;
	}
	struct vr_ctx *c = vr_ctx(pd->context);
	if (vr_odp_attach(c)) {
		errno = EOPNOTSUPP;
		return EOPNOTSUPP;
	}
	if (num_sge == 0 || num_sge > VRNIC_MAX_SGE) {
		errno = EINVAL;
		return EINVAL;
	}
	struct vrnic_cmd_advise_mr cmd = { .pd_handle = pd->handle, .advice = (uint32_t)advice, .flags = flags,
		.num_sge = num_sge };
	struct vrnic_sge sges[VRNIC_MAX_SGE];
	for (uint32_t i = 0; i < num_sge; i++)
		sges[i] = (struct vrnic_sge){ .addr = sg_list[i].addr, .length = sg_list[i].length,
					      .lkey = sg_list[i].lkey };
	int ret = vr_call(c, VRNIC_CMD_ADVISE_MR, &cmd, sizeof cmd, sges, num_sge * sizeof sges[0], NULL, 0, NULL, 0);
	if (ret)
		errno = ret;
	return ret;
}
