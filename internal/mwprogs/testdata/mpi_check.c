/* mpi_check.c - point-to-point and collectives with every result checked:
 * a ping-pong between ranks 0 and 1 (sizes 1 B to 4 MiB, contents checked
 * each way), MPI_Allreduce (sum and max over arrays whose values depend on
 * the rank), MPI_Alltoall and MPI_Bcast. Prints "mpi_check: OK ranks=N
 * bytes=B" on rank 0 when every check held; any mismatch aborts the job
 * with a message naming it. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static void fail(const char *what, long i, long got, long want) {
	fprintf(stderr, "mpi_check: rank %d: %s: at %ld got %ld want %ld\n", rank, what, i, got, want);
	MPI_Abort(MPI_COMM_WORLD, 3);
}

static uint8_t pattern(long i, int from, int round) { return (uint8_t)(i * 7 + from * 31 + round * 13 + 1); }

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	long moved = 0;

	/* Ping-pong between 0 and 1. */
	const long maxlen = 4L << 20;
	uint8_t *buf = malloc(maxlen);
	if (!buf)
		MPI_Abort(MPI_COMM_WORLD, 2);
	for (long len = 1; len <= maxlen; len *= 4) {
		for (int round = 0; round < 5; round++) {
			if (rank == 0) {
				for (long i = 0; i < len; i++)
					buf[i] = pattern(i, 0, round);
				MPI_Send(buf, (int)len, MPI_BYTE, 1, round, MPI_COMM_WORLD);
				memset(buf, 0, len);
				MPI_Recv(buf, (int)len, MPI_BYTE, 1, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (long i = 0; i < len; i++)
					if (buf[i] != pattern(i, 1, round))
						fail("ping-pong reply", i, buf[i], pattern(i, 1, round));
				moved += 2 * len;
			} else if (rank == 1) {
				MPI_Status st;
				MPI_Recv(buf, (int)len, MPI_BYTE, 0, round, MPI_COMM_WORLD, &st);
				int n;
				MPI_Get_count(&st, MPI_BYTE, &n);
				if (n != len)
					fail("ping-pong length", 0, n, len);
				for (long i = 0; i < len; i++)
					if (buf[i] != pattern(i, 0, round))
						fail("ping-pong request", i, buf[i], pattern(i, 0, round));
				for (long i = 0; i < len; i++)
					buf[i] = pattern(i, 1, round);
				MPI_Send(buf, (int)len, MPI_BYTE, 0, round, MPI_COMM_WORLD);
			}
		}
	}
	free(buf);

	/* Allreduce: sum and max of rank-dependent values. */
	const int n = 1 << 16;
	int64_t *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
	for (int i = 0; i < n; i++)
		in[i] = (int64_t)i * (rank + 1) + rank;
	MPI_Allreduce(in, out, n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
	for (int i = 0; i < n; i++) {
		int64_t want = (int64_t)i * size * (size + 1) / 2 + (int64_t)size * (size - 1) / 2;
		if (out[i] != want)
			fail("allreduce sum", i, out[i], want);
	}
	MPI_Allreduce(in, out, n, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
	for (int i = 0; i < n; i++) {
		int64_t want = (int64_t)i * size + (size - 1);
		if (out[i] != want)
			fail("allreduce max", i, out[i], want);
	}
	free(in);
	free(out);

	/* Alltoall: block j of rank r's send buffer goes to rank j. */
	const int blk = 4096;
	int32_t *sb = malloc((size_t)size * blk * sizeof *sb), *rb = malloc((size_t)size * blk * sizeof *rb);
	for (int j = 0; j < size; j++)
		for (int k = 0; k < blk; k++)
			sb[j * blk + k] = rank * 1000000 + j * 10000 + k;
	MPI_Alltoall(sb, blk, MPI_INT32_T, rb, blk, MPI_INT32_T, MPI_COMM_WORLD);
	for (int j = 0; j < size; j++)
		for (int k = 0; k < blk; k++) {
			int32_t want = j * 1000000 + rank * 10000 + k;
			if (rb[j * blk + k] != want)
				fail("alltoall", (long)j * blk + k, rb[j * blk + k], want);
		}
	free(sb);
	free(rb);

	/* Bcast of 1 MiB from the last rank. */
	const int bn = 1 << 20;
	uint8_t *bb = malloc(bn);
	for (int i = 0; i < bn; i++)
		bb[i] = rank == size - 1 ? pattern(i, size - 1, 9) : 0;
	MPI_Bcast(bb, bn, MPI_BYTE, size - 1, MPI_COMM_WORLD);
	for (int i = 0; i < bn; i++)
		if (bb[i] != pattern(i, size - 1, 9))
			fail("bcast", i, bb[i], pattern(i, size - 1, 9));
	free(bb);

	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_check: OK ranks=%d bytes=%ld\n", size, moved);
	MPI_Finalize();
	return 0;
}
