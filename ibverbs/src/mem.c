/* mem.c - host memory: ring memory of a context, and the program's own
 * memory backed by memfds at the same virtual addresses.
 *
 * Rings (CQ, SQ, RQ, SRQ) and page lists live in chunks: sealed memfds of
 * at least CHUNK_PAGES pages, mapped and given to the daemon with
 * ADD_HOST_MEM, allocated a page run at a time.
 *
 * The program's memory (malloc, memalign, stack, .data/.bss, anonymous
 * mmap) is private memory the daemon cannot map. Registering it moves it
 * into a memfd in place: the page-rounded range is copied into a new memfd
 * (a "segment"), which is then mapped MAP_SHARED|MAP_FIXED over the same
 * addresses with the same protection. Pointers and contents are unchanged;
 * the daemon maps the same memfd. Segments are process-wide and never
 * merged or shrunk: a registration that overlaps existing segments reuses
 * them and creates new segments only for the pages not yet backed, so an
 * MR's page list may span several segments. Each context gives each
 * segment it uses to its daemon once. Deregistration keeps the mapping (the
 * program still owns the memory). Before reuse a segment is checked
 * against /proc/self/maps: if the program unmapped or replaced its pages,
 * it is forgotten and the pages are backed anew. */
#include "vrnic_ibv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHUNK_PAGES 1024u /* 4 MiB */

static int new_memfd(const char *name, size_t len) {
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)len) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static int add_host_mem(struct vr_ctx *c, int fd, size_t len, uint64_t *pa, uint32_t *handle) {
	struct vrnic_cmd_add_host_mem a = { .length = len };
	struct vrnic_resp_add_host_mem r;
	int ret = vr_call(c, VRNIC_CMD_ADD_HOST_MEM, &a, sizeof a, NULL, 0, &fd, 1, &r, sizeof r);
	if (!ret) {
		*pa = r.pa_base;
		*handle = r.handle;
	}
	return ret;
}

static struct vr_chunk *new_chunk(struct vr_ctx *c, size_t pages, int *err) {
	struct vr_chunk *ch = calloc(1, sizeof *ch);
	uint8_t *used = calloc(pages, 1);
	if (!ch || !used) {
		free(ch);
		free(used);
		*err = ENOMEM;
		return NULL;
	}
	size_t len = pages * VR_PAGE;
	int fd = new_memfd("vrnic-rings", len);
	if (fd < 0) {
		*err = errno;
		goto fail;
	}
	ch->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ch->base == MAP_FAILED) {
		*err = errno;
		close(fd);
		goto fail;
	}
	madvise(ch->base, len, MADV_DONTFORK);
	uint32_t handle;
	*err = add_host_mem(c, fd, len, &ch->pa, &handle);
	close(fd);
	if (*err) {
		munmap(ch->base, len);
		goto fail;
	}
	ch->pages = pages;
	ch->used = used;
	ch->next = c->chunks;
	c->chunks = ch;
	return ch;
fail:
	free(ch);
	free(used);
	return NULL;
}

/* vr_alloc allocates len bytes (whole pages, zeroed) of ring memory. */
int vr_alloc(struct vr_ctx *c, size_t len, struct vr_buf *b) {
	size_t pages = (len + VR_PAGE - 1) / VR_PAGE;
	if (!pages)
		pages = 1;
	int err = 0;
	pthread_mutex_lock(&c->mem_mu);
	for (int attempt = 0; attempt < 2; attempt++) {
		for (struct vr_chunk *ch = c->chunks; ch; ch = ch->next) {
			size_t run = 0;
			for (size_t i = 0; i < ch->pages; i++) {
				run = ch->used[i] ? 0 : run + 1;
				if (run == pages) {
					size_t first = i + 1 - pages;
					memset(ch->used + first, 1, pages);
					b->p = ch->base + first * VR_PAGE;
					b->pa = ch->pa + first * VR_PAGE;
					b->len = pages * VR_PAGE;
					b->chunk = ch;
					b->domain = NULL;
					b->res_type = 0;
					memset(b->p, 0, b->len);
					pthread_mutex_unlock(&c->mem_mu);
					return 0;
				}
			}
		}
		if (attempt == 0 && !new_chunk(c, pages > CHUNK_PAGES ? pages : CHUNK_PAGES, &err))
			break;
	}
	pthread_mutex_unlock(&c->mem_mu);
	return err ? err : ENOMEM;
}

void vr_free(struct vr_ctx *c, struct vr_buf *b) {
	if (b->domain) {
		vr_free_domain_buf(b);
		return;
	}
	if (!b->chunk)
		return;
	pthread_mutex_lock(&c->mem_mu);
	size_t first = (size_t)(b->p - b->chunk->base) / VR_PAGE;
	memset(b->chunk->used + first, 0, b->len / VR_PAGE);
	pthread_mutex_unlock(&c->mem_mu);
	b->chunk = NULL;
}

void vr_free_chunks(struct vr_ctx *c) {
	struct vr_chunk *ch = c->chunks;
	while (ch) {
		struct vr_chunk *next = ch->next;
		munmap(ch->base, ch->pages * VR_PAGE);
		free(ch->used);
		free(ch);
		ch = next;
	}
	c->chunks = NULL;
}

/* ---- the program's memory ---- */

struct seg {
	uintptr_t start, end;
	int fd;
	ino_t ino;
	uint64_t id;
};

static pthread_mutex_t segs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct seg *segs; /* sorted by start, disjoint */
static size_t nsegs, capsegs;
static uint64_t next_seg_id = 1;

struct vma {
	uintptr_t start, end;
	int prot;
	bool shared;
	uint64_t off;
	ino_t ino;
	bool special; /* [vdso], [vvar], ... */
	bool hugetlb; /* private hugetlb memory: split only at huge pages */
};

/* read_maps returns the mappings overlapping [start, end), in order. */
static int read_maps(uintptr_t start, uintptr_t end, struct vma **out, size_t *n) {
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f)
		return errno;
	struct vma *v = NULL;
	size_t cnt = 0, cap = 0;
	char line[4096 + 128];
	while (fgets(line, sizeof line, f)) {
		unsigned long s, e, off, ino;
		char perms[8];
		unsigned dmaj, dmin;
		int pos = 0;
		if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %n", &s, &e, perms, &off, &dmaj, &dmin, &ino, &pos) < 7)
			continue;
		if (e <= start || s >= end)
			continue;
		if (cnt == cap) {
			cap = cap ? cap * 2 : 16;
			struct vma *v2 = realloc(v, cap * sizeof *v);
			if (!v2) {
				free(v);
				fclose(f);
				return ENOMEM;
			}
			v = v2;
		}
		const char *path = line + pos;
		v[cnt] = (struct vma){ .start = s, .end = e, .off = off, .ino = (ino_t)ino, .shared = perms[3] == 's' };
		v[cnt].prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
			      (perms[2] == 'x' ? PROT_EXEC : 0);
		v[cnt].special = path[0] == '[' && strncmp(path, "[heap]", 6) != 0 && strncmp(path, "[stack", 6) != 0;
		v[cnt].hugetlb = strncmp(path, "/anon_hugepage", 14) == 0;
		cnt++;
	}
	fclose(f);
	*out = v;
	*n = cnt;
	return 0;
}

/* seg_valid reports whether [s, e) of segment g is still mapped from its
 * memfd at the offsets it was mapped at. */
static bool seg_valid(const struct seg *g, uintptr_t s, uintptr_t e, const struct vma *v, size_t nv) {
	uintptr_t at = s;
	for (size_t i = 0; i < nv && at < e; i++) {
		if (v[i].end <= at)
			continue;
		if (v[i].start > at || !v[i].shared || v[i].ino != g->ino || v[i].off + (at - v[i].start) != at - g->start)
			return false;
		at = v[i].end;
	}
	return at >= e;
}

static void seg_remove(size_t i) {
	close(segs[i].fd);
	memmove(&segs[i], &segs[i + 1], (nsegs - i - 1) * sizeof *segs);
	nsegs--;
}

/* Fork. Segments are MADV_DONTFORK: a child must not share them with the
 * parent (they are MAP_SHARED memfds: the child's heap writes would land
 * in the parent's memory). In the child, each segment's range is mapped
 * back MAP_PRIVATE from its memfd: the child gets the program's memory as
 * it was at the fork, copied on its own writes, as the kernel gives a
 * child registered memory, instead of a hole that would crash it at its
 * first touch (a fork after ibv_reg_mr of malloc'd memory, the allocator's
 * own data sharing its pages). It may see the parent's later writes to
 * pages it has not written itself (MAP_PRIVATE), and the pages are read
 * and write whatever they were. */
static void segs_prepare(void) { pthread_mutex_lock(&segs_mu); }
static void segs_parent(void) { pthread_mutex_unlock(&segs_mu); }
static void segs_child(void) {
	for (size_t i = 0; i < nsegs; i++)
		mmap((void *)segs[i].start, segs[i].end - segs[i].start, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED,
		     segs[i].fd, 0);
	pthread_mutex_unlock(&segs_mu);
}
static pthread_once_t segs_fork_once = PTHREAD_ONCE_INIT;
static void segs_fork_init(void) { pthread_atfork(segs_prepare, segs_parent, segs_child); }

static int seg_insert(struct seg g) {
	pthread_once(&segs_fork_once, segs_fork_init);
	if (nsegs == capsegs) {
		size_t cap = capsegs ? capsegs * 2 : 16;
		struct seg *s2 = realloc(segs, cap * sizeof *segs);
		if (!s2)
			return ENOMEM;
		segs = s2;
		capsegs = cap;
	}
	size_t i = 0;
	while (i < nsegs && segs[i].start < g.start)
		i++;
	memmove(&segs[i + 1], &segs[i], (nsegs - i) * sizeof *segs);
	segs[i] = g;
	nsegs++;
	return 0;
}

/* A remap job runs on a helper thread, so that the thread registering
 * memory on its own stack does not write to the pages between their copy
 * and their replacement (its frames are below the buffer, possibly in the
 * same page): while the job runs it only waits in pthread_join. */
struct piece {
	uintptr_t start, end;
	int prot;
};

struct remap_job {
	int fd;
	uintptr_t base;
	struct piece *p;
	size_t np;
	int err;
};

static void *remap_thread(void *arg) {
	struct remap_job *j = arg;
	for (size_t i = 0; i < j->np; i++) {
		uintptr_t at = j->p[i].start;
		while (at < j->p[i].end) {
			/* The raw system call: whole pages are copied, bytes the
			 * program never allocated included, which a sanitizer's
			 * pwrite interceptor would report (ASan redzones). */
			ssize_t n = syscall(SYS_pwrite64, j->fd, (const void *)at, j->p[i].end - at,
					    (off_t)(at - j->base));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				j->err = n < 0 ? errno : EIO;
				return NULL;
			}
			at += (uintptr_t)n;
		}
	}
	for (size_t i = 0; i < j->np; i++) {
		size_t len = j->p[i].end - j->p[i].start;
		void *m = mmap((void *)j->p[i].start, len, j->p[i].prot, MAP_SHARED | MAP_FIXED, j->fd,
			       (off_t)(j->p[i].start - j->base));
		if (m == MAP_FAILED) {
			/* Pieces already replaced hold the same bytes; the
			 * rest keep their private pages. */
			j->err = errno;
			return NULL;
		}
		madvise(m, len, MADV_DONTFORK);
	}
	return NULL;
}

/* back_range backs [s, e) (not covered by any segment) with a new
 * segment. */
static int back_range(uintptr_t s, uintptr_t e, const struct vma *v, size_t nv) {
	struct piece *p = calloc(nv ? nv : 1, sizeof *p);
	if (!p)
		return ENOMEM;
	size_t np = 0;
	uintptr_t at = s;
	for (size_t i = 0; i < nv && at < e; i++) {
		if (v[i].end <= at)
			continue;
		if (v[i].start > at) { /* a hole: unmapped memory */
			free(p);
			return EFAULT;
		}
		if (v[i].special || !(v[i].prot & PROT_READ)) {
			free(p);
			return EFAULT;
		}
		if (v[i].shared) { /* file or shared memory the daemon cannot reach */
			free(p);
			return EOPNOTSUPP;
		}
		uintptr_t pe = v[i].end < e ? v[i].end : e;
		p[np++] = (struct piece){ .start = at, .end = pe, .prot = v[i].prot };
		at = pe;
	}
	if (at < e) {
		free(p);
		return EFAULT;
	}
	int fd = new_memfd("vrnic-mr", e - s);
	if (fd < 0) {
		free(p);
		return errno;
	}
	struct stat st;
	fstat(fd, &st);
	struct remap_job j = { .fd = fd, .base = s, .p = p, .np = np };
	pthread_t t;
	int ret = pthread_create(&t, NULL, remap_thread, &j);
	if (ret) {
		free(p);
		close(fd);
		return ret;
	}
	pthread_join(t, NULL);
	free(p);
	if (j.err) {
		close(fd);
		return j.err;
	}
	ret = seg_insert((struct seg){ .start = s, .end = e, .fd = fd, .ino = st.st_ino, .id = next_seg_id++ });
	if (ret)
		close(fd); /* the mapping stays valid; it is just not known */
	return ret;
}

/* ctx_seg_pa returns the PA at which context c's daemon sees segment g,
 * giving it the segment first if needed. */
static int ctx_seg_pa(struct vr_ctx *c, const struct seg *g, uint64_t *pa) {
	pthread_mutex_lock(&c->mem_mu);
	for (size_t i = 0; i < c->nsegs; i++)
		if (c->segs[i].seg_id == g->id) {
			*pa = c->segs[i].pa;
			pthread_mutex_unlock(&c->mem_mu);
			return 0;
		}
	pthread_mutex_unlock(&c->mem_mu);
	uint32_t handle;
	int ret = add_host_mem(c, g->fd, g->end - g->start, pa, &handle);
	if (ret)
		return ret;
	pthread_mutex_lock(&c->mem_mu);
	if (c->nsegs == c->capsegs) {
		size_t cap = c->capsegs ? c->capsegs * 2 : 8;
		struct vr_seg_reg *s2 = realloc(c->segs, cap * sizeof *s2);
		if (!s2) {
			pthread_mutex_unlock(&c->mem_mu);
			return ENOMEM;
		}
		c->segs = s2;
		c->capsegs = cap;
	}
	c->segs[c->nsegs++] = (struct vr_seg_reg){ .seg_id = g->id, .pa = *pa, .handle = handle };
	pthread_mutex_unlock(&c->mem_mu);
	return 0;
}

/* vr_user_pages backs the npages pages from start (page aligned) with
 * segments and fills pages with their physical addresses as context c's
 * daemon sees them. */
int vr_user_pages(struct vr_ctx *c, uintptr_t start, size_t npages, bool write, uint64_t *pages) {
	uintptr_t end = start + npages * VR_PAGE;
	if (end < start)
		return EINVAL;
	pthread_mutex_lock(&segs_mu);
	struct vma *v = NULL;
	size_t nv = 0;
	int ret = read_maps(start, end, &v, &nv);
	if (ret)
		goto out;
	/* Memory the device may write must be writable by the program, as
	 * the kernel's pinning for write requires (EFAULT otherwise). */
	for (size_t i = 0; write && i < nv; i++)
		if (v[i].end > start && v[i].start < end && !(v[i].prot & PROT_WRITE)) {
			ret = EFAULT;
			goto out;
		}
	/* A hugetlb mapping cannot be split inside a huge page (mmap over a
	 * part of one fails with EINVAL): its pages are backed whole, each
	 * hugetlb mapping the range touches (they start and end at huge
	 * pages) in full. */
	uintptr_t bs = start, be = end;
	for (size_t i = 0; i < nv; i++)
		if (v[i].hugetlb && v[i].end > start && v[i].start < end) {
			bs = v[i].start < bs ? v[i].start : bs;
			be = v[i].end > be ? v[i].end : be;
		}
	/* Forget segments whose pages in the range are no longer theirs. */
	for (size_t i = 0; i < nsegs;) {
		struct seg *g = &segs[i];
		if (g->end > bs && g->start < be) {
			uintptr_t s = g->start > bs ? g->start : bs, e = g->end < be ? g->end : be;
			if (!seg_valid(g, s, e, v, nv)) {
				seg_remove(i);
				continue;
			}
		}
		i++;
	}
	/* Back the gaps between segments. */
	uintptr_t at = bs;
	while (at < be) {
		size_t i = 0;
		while (i < nsegs && segs[i].end <= at)
			i++;
		if (i < nsegs && segs[i].start <= at) {
			at = segs[i].end;
			continue;
		}
		uintptr_t ge = i < nsegs && segs[i].start < be ? segs[i].start : be;
		if ((ret = back_range(at, ge, v, nv)))
			goto out;
		at = ge;
	}
	/* The page list. */
	size_t k = 0;
	for (size_t i = 0; i < nsegs && k < npages; i++) {
		struct seg *g = &segs[i];
		if (g->end <= start || g->start >= end)
			continue;
		uint64_t pa;
		if ((ret = ctx_seg_pa(c, g, &pa)))
			goto out;
		uintptr_t s = g->start > start ? g->start : start, e = g->end < end ? g->end : end;
		for (uintptr_t p = s; p < e; p += VR_PAGE)
			pages[(p - start) / VR_PAGE] = pa + (p - g->start);
		k += (e - s) / VR_PAGE;
	}
	if (k != npages)
		ret = EFAULT;
out:
	pthread_mutex_unlock(&segs_mu);
	free(v);
	return ret;
}
