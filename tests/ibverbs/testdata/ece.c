/* ece.c - ECE through the standard verbs (ibv_query_ece, ibv_set_ece)
 * between two daemons, as rdma-core's mlx5 provider answers them:
 *
 *   - ibv_query_ece: vrnic's vendor ID (0x1ded) and, before any set,
 *     every option the device supports (argv[1]: 3, or 0 when the daemons
 *     run -ece=false); a UD QP has none;
 *   - ibv_set_ece: vendor 0 EOPNOTSUPP, a comp_mask bit or another
 *     vendor's ID EINVAL, a UD QP or a device without ECE EOPNOTSUPP,
 *     nothing changed by a refusal; unknown option bits are dropped;
 *   - two RC pairs are connected by hand: pair 1 with options set on each
 *     side (A: sr, B: all), pair 2 without (VRNIC_ECE applies there, if
 *     set), and a UD QP moved to RTS (VRNIC_ECE never applies to it);
 *     after RTS the options set are what ibv_query_ece reports.
 *
 * Then it prints the QP numbers ("QPS a1 b1 a2 b2 ud") and "READY" and
 * waits for the file argv[2] to exist (the test checks the daemons' view
 * of the QPs meanwhile), moves A's pair-1 QP to RESET (ibv_query_ece
 * gives the device's options again) and prints "QPS_RESET" and waits for
 * argv[2].reset, destroys everything and prints "OK ece ...". Exit 0,
 * or "ERROR ..." and 1. */
#include "check.h"

#include <errno.h>
#include <unistd.h>

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	union ibv_gid gid;
};

static void open_side(struct side *s, struct ibv_device *dev) {
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		die("ibv_open_device");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
	if (!s->pd || !s->cq)
		die("resources");
}

static struct ibv_qp *qp_of(struct side *s, enum ibv_qp_type t) {
	struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = t,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(s->pd, &a);
	if (!qp)
		die("ibv_create_qp");
	return qp;
}

static void expect_ece(const char *what, struct ibv_qp *qp, uint32_t options) {
	struct ibv_ece e;
	memset(&e, 0xa5, sizeof e);
	if (ibv_query_ece(qp, &e))
		die("ibv_query_ece");
	if (e.vendor_id != 0x1ded || e.options != options || e.comp_mask) {
		char d[128];
		snprintf(d, sizeof d, "vendor %#x options %#x comp_mask %#x, want 0x1ded %#x 0", e.vendor_id, e.options,
			 e.comp_mask, options);
		fail("ibv_query_ece", what, d);
	}
}

static void expect_set(const char *what, struct ibv_qp *qp, uint32_t vendor, uint32_t options, uint32_t comp_mask,
		       int want) {
	struct ibv_ece e = { .vendor_id = vendor, .options = options, .comp_mask = comp_mask };
	errno = 0;
	int ret = ibv_set_ece(qp, &e);
	if (ret != want || (want && errno != want)) {
		char d[96];
		snprintf(d, sizeof d, "returned %d (errno %d), want %d", ret, errno, want);
		fail("ibv_set_ece", what, d);
	}
}

static void wait_file(const char *path) {
	int64_t end = now_ms() + 60000;
	while (access(path, F_OK)) {
		if (now_ms() > end)
			fail("gate", path, "not created in 60 s");
		usleep(10000);
	}
}

int main(int argc, char **argv) {
	if (argc != 3) {
		printf("ERROR usage: ece CAPS GATE\n");
		return 1;
	}
	uint32_t caps = (uint32_t)strtoul(argv[1], NULL, 0);
	setvbuf(stdout, NULL, _IONBF, 0);
	struct ibv_device **list = two_devices();
	struct side a, b;
	open_side(&a, list[0]);
	open_side(&b, list[1]);
	struct ibv_qp *a1 = qp_of(&a, IBV_QPT_RC), *b1 = qp_of(&b, IBV_QPT_RC);
	struct ibv_qp *a2 = qp_of(&a, IBV_QPT_RC), *b2 = qp_of(&b, IBV_QPT_RC);
	struct ibv_qp *ud = qp_of(&a, IBV_QPT_UD);

	expect_ece("new RC QP", a1, caps);
	expect_ece("new UD QP", ud, 0);
	expect_set("vendor 0", a1, 0, 1, 0, EOPNOTSUPP);
	expect_set("comp_mask", a1, 0x1ded, 1, 1, EINVAL);
	expect_set("another vendor", a1, 0x15b3, 1, 0, EINVAL);
	expect_ece("after refusals", a1, caps);
	expect_set("UD QP", ud, 0x1ded, 1, 0, EOPNOTSUPP);
	if (caps) {
		expect_set("A: sr and an unknown bit", a1, 0x1ded, 1 | 1 << 5, 0, 0);
		expect_ece("A: set sr", a1, 1);
		expect_set("B: all", b1, 0x1ded, 3, 0, 0);
		expect_ece("B: set all", b1, 3);
	} else {
		expect_set("ECE switched off", a1, 0x1ded, 1, 0, EOPNOTSUPP);
		expect_ece("ECE switched off", a1, 0);
	}
	int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	rc_to_rts(a1, b1->qp_num, &b.gid, access, 0x1111, 1);
	rc_to_rts(b1, a1->qp_num, &a.gid, access, 0x1111, 1);
	rc_to_rts(a2, b2->qp_num, &b.gid, access, 0x2222, 1);
	rc_to_rts(b2, a2->qp_num, &a.gid, access, 0x2222, 1);
	struct ibv_qp_attr u = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	if (ibv_modify_qp(ud, &u, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("UD INIT");
	u.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(ud, &u, IBV_QP_STATE))
		die("UD RTR");
	u.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(ud, &u, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("UD RTS");
	if (caps) {
		expect_ece("A: sr in force", a1, 1);
		expect_ece("B: all in force", b1, 3);
		/* Past RTR a set waits for the next move to INIT or RTR. */
		expect_set("A: in RTS", a1, 0x1ded, 3, 0, 0);
	}
	expect_ece("UD in RTS", ud, 0);
	printf("QPS %u %u %u %u %u\nREADY\n", a1->qp_num, b1->qp_num, a2->qp_num, b2->qp_num, ud->qp_num);
	wait_file(argv[2]);

	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RESET };
	if (ibv_modify_qp(a1, &r, IBV_QP_STATE))
		die("RESET");
	expect_ece("after RESET", a1, caps);
	printf("QPS_RESET\n");
	char gate[4096];
	snprintf(gate, sizeof gate, "%s.reset", argv[2]);
	wait_file(gate);

	struct ibv_qp *qps[] = { a1, b1, a2, b2, ud };
	for (size_t i = 0; i < sizeof qps / sizeof qps[0]; i++)
		if (ibv_destroy_qp(qps[i]))
			die("ibv_destroy_qp");
	struct side *sides[] = { &a, &b };
	for (int i = 0; i < 2; i++) {
		if (ibv_destroy_cq(sides[i]->cq) || ibv_dealloc_pd(sides[i]->pd) || ibv_close_device(sides[i]->ctx))
			die("close");
	}
	ibv_free_device_list(list);
	printf("OK ece query set errors connect reset\n");
	return 0;
}
