/*
 * te_lease.c - the transfer engine's standing lease of the one-copy shm path (te_lease.h).
 *
 * The memfds are shared memory of two processes, so every word the other process writes is
 * read with __atomic builtins (lock-free on the 64-bit hosts we build for, and so
 * address-free across processes); the ranges are a seqlock's payload, copied and then
 * validated by the generation. The target trusts nothing a peer can write but its own
 * slot's mark and counts: the ranges' memfd is sealed against writes (the peer maps it
 * read-only), the generation it waits on is its own count, and each peer's slot is a memfd
 * of its own.
 */
#include "client/te/te_lease.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "client/include/kvpool_te.h"
#include "client/transport/wire.h"
#include "common/log.h"

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

_Static_assert(__atomic_always_lock_free(sizeof(uint64_t), 0), "the lease needs 64-bit atomics");
_Static_assert(KVP_TE_READ == 0 && KVP_TE_WRITE == 1, "the slot's counts are by opcode");

/* How long an unregister waits for a busy peer before it says so (it goes on waiting: the
 * peer may be writing into the range). */
#define WAIT_WARN_MS 5000

#ifdef MFD_NOEXEC_SEAL
#define LEASE_MFD_NOEXEC_SEAL MFD_NOEXEC_SEAL
#else
#define LEASE_MFD_NOEXEC_SEAL 0x0008U
#endif

enum { SLOT_FREE, SLOT_LEASED, SLOT_REVOKED };

typedef struct host_slot {
    int state; /* SLOT_* */
    int memfd, pidfd;
    kvp_data_te_lease_slot_t *page;
} host_slot_t;

struct kvp_te_lease_host {
    int fd; /* the ranges' */
    kvp_data_te_lease_regions_t *area;
    uint64_t gen;         /* ours: the shared one is its copy (publish under the regions lock) */
    pthread_mutex_t lock; /* slots[], retired */
    host_slot_t slots[KVP_TE_LEASE_SLOTS];
    uint64_t retired_moved[2], retired_bytes[2];
};

/* A memfd of size bytes, mapped read-write here, sealed with seals after (shrink and grow
 * at least: a peer holding it cannot make us fault). */
static int memfd_make(const char *name, size_t size, int seals, void **map_p)
{
    /* not executable, sealed so (kernels from 6.3 ask it; older ones refuse the flag) */
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | LEASE_MFD_NOEXEC_SEAL);
    if (fd < 0 && errno == EINVAL)
        fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0)
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return -1;
    }
    if (fcntl(fd, F_ADD_SEALS, seals | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        munmap(m, size);
        close(fd);
        return -1;
    }
    *map_p = m;
    return fd;
}

kvp_status_t kvp_te_lease_host_create(kvp_te_lease_host_t **h_p)
{
    *h_p = NULL;
    kvp_te_lease_host_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return KVP_ERR_NOMEM;
    void *m;
    /* the ranges: written here only (F_SEAL_FUTURE_WRITE: our mapping stays writable, no
     * other can be made, and a peer's read-only one cannot be made writable) */
    h->fd =
        memfd_make("kvpool-te-lease", sizeof(kvp_data_te_lease_regions_t), F_SEAL_FUTURE_WRITE, &m);
    if (h->fd < 0) {
        free(h);
        return KVP_ERR_NOMEM;
    }
    h->area = m;
    h->area->magic = KVP_TE_LEASE_MAGIC;
    pthread_mutex_init(&h->lock, NULL);
    *h_p = h;
    return KVP_OK;
}

static void slot_free_locked(kvp_te_lease_host_t *h, host_slot_t *s)
{
    for (int d = 0; d < 2; d++) {
        h->retired_moved[d] += LOAD(&s->page->moved[d]);
        h->retired_bytes[d] += LOAD(&s->page->bytes[d]);
    }
    munmap(s->page, sizeof(*s->page));
    close(s->memfd);
    close(s->pidfd);
    *s = (host_slot_t){.state = SLOT_FREE, .memfd = -1, .pidfd = -1};
}

void kvp_te_lease_host_destroy(kvp_te_lease_host_t *h)
{
    if (h == NULL)
        return;
    for (int i = 0; i < KVP_TE_LEASE_SLOTS; i++)
        if (h->slots[i].state != SLOT_FREE)
            slot_free_locked(h, &h->slots[i]);
    munmap(h->area, sizeof(*h->area));
    close(h->fd);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

/* Has the slot's process exited? */
static bool slot_gone(const host_slot_t *s)
{
    struct pollfd p = {.fd = s->pidfd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* Revoked slots whose peer is not copying (it saw or will see the revocation before it
 * copies again) or is gone: freed. */
static void reap_locked(kvp_te_lease_host_t *h)
{
    for (int i = 0; i < KVP_TE_LEASE_SLOTS; i++) {
        host_slot_t *s = &h->slots[i];
        if (s->state == SLOT_REVOKED && ((LOAD(&s->page->state) & 1) == 0 || slot_gone(s)))
            slot_free_locked(h, s);
    }
}

int kvp_te_lease_host_take(kvp_te_lease_host_t *h, pid_t pid, int fds[2])
{
    pthread_mutex_lock(&h->lock);
    reap_locked(h);
    int i = 0;
    while (i < KVP_TE_LEASE_SLOTS && h->slots[i].state != SLOT_FREE)
        i++;
    host_slot_t *s = i < KVP_TE_LEASE_SLOTS ? &h->slots[i] : NULL;
    if (s == NULL)
        errno = ENOSPC;
    void *m = NULL;
    int pidfd = -1, memfd = -1;
    if (s != NULL && (pidfd = (int)syscall(SYS_pidfd_open, pid, 0)) >= 0)
        memfd = memfd_make("kvpool-te-slot", sizeof(kvp_data_te_lease_slot_t), 0, &m);
    if (memfd < 0) {
        if (pidfd >= 0)
            close(pidfd);
        pthread_mutex_unlock(&h->lock);
        return -1;
    }
    *s = (host_slot_t){.state = SLOT_LEASED, .memfd = memfd, .pidfd = pidfd, .page = m};
    s->page->magic = KVP_TE_SLOT_MAGIC;
    fds[0] = h->fd;
    fds[1] = memfd;
    pthread_mutex_unlock(&h->lock);
    return i;
}

void kvp_te_lease_host_give(kvp_te_lease_host_t *h, int slot)
{
    if (slot < 0 || slot >= KVP_TE_LEASE_SLOTS)
        return;
    pthread_mutex_lock(&h->lock);
    host_slot_t *s = &h->slots[slot];
    if (s->state == SLOT_LEASED) {
        STORE(&s->page->revoked, 1); /* before its mark is read: reap_locked */
        s->state = SLOT_REVOKED;
        reap_locked(h);
    }
    pthread_mutex_unlock(&h->lock);
}

uint64_t *kvp_te_lease_host_begin(kvp_te_lease_host_t *h, size_t *cap_p)
{
    STORE(&h->area->gen, ++h->gen);          /* odd */
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* before any range is rewritten */
    *cap_p = KVP_TE_LEASE_REGIONS;
    return &h->area->regions[0][0];
}

uint64_t kvp_te_lease_host_end(kvp_te_lease_host_t *h, size_t n)
{
    STORE(&h->area->n_regions, (uint64_t)n);
    STORE(&h->area->gen, ++h->gen); /* even: after the ranges (a release) */
    return h->gen;
}

void kvp_te_lease_host_wait(kvp_te_lease_host_t *h, uint64_t g)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool warned = false;
    long nap_ns = 20000; /* doubled up to 1 ms: a copy takes microseconds to milliseconds */
    for (int i = 0; i < KVP_TE_LEASE_SLOTS; i++) {
        for (;;) {
            pthread_mutex_lock(&h->lock);
            reap_locked(h);
            host_slot_t *s = &h->slots[i];
            bool wait = false;
            if (s->state != SLOT_FREE) {
                uint64_t st = LOAD(&s->page->state);
                wait = (st & 1) != 0 && (st >> 1) < g && !slot_gone(s);
            }
            pthread_mutex_unlock(&h->lock);
            if (!wait)
                break;
            struct timespec now, nap = {.tv_nsec = nap_ns};
            nap_ns = nap_ns < 1000000 ? nap_ns * 2 : 1000000;
            clock_gettime(CLOCK_MONOTONIC, &now);
            int64_t ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
            if (!warned && ms >= WAIT_WARN_MS) {
                KVP_LOG_WARN("transfer engine: an unregister has waited %lld ms for a shm peer "
                             "still copying under the ranges of before (stopped?); it waits "
                             "until the peer is done or gone",
                             (long long)ms);
                warned = true;
            }
            nanosleep(&nap, NULL);
        }
    }
}

void kvp_te_lease_host_moved(kvp_te_lease_host_t *h, uint64_t moved[2], uint64_t bytes[2],
                             uint64_t *held_p)
{
    pthread_mutex_lock(&h->lock);
    reap_locked(h);
    *held_p = 0;
    for (int d = 0; d < 2; d++) {
        moved[d] = h->retired_moved[d];
        bytes[d] = h->retired_bytes[d];
    }
    for (int i = 0; i < KVP_TE_LEASE_SLOTS; i++) {
        const host_slot_t *s = &h->slots[i];
        if (s->state == SLOT_FREE)
            continue;
        *held_p += s->state == SLOT_LEASED;
        for (int d = 0; d < 2; d++) {
            moved[d] += LOAD(&s->page->moved[d]);
            bytes[d] += LOAD(&s->page->bytes[d]);
        }
    }
    pthread_mutex_unlock(&h->lock);
}

/* Yama's ptrace_scope; 0 when this kernel has no Yama, 1 when it cannot be read. */
static int yama_scope(void)
{
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (f == NULL)
        return 0; /* no Yama in this kernel */
    int scope = 1;
    if (fscanf(f, "%d", &scope) != 1)
        scope = 1;
    fclose(f);
    return scope;
}

bool kvp_te_lease_allowed(void)
{
    return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1 && yama_scope() == 0;
}

bool kvp_te_ptracer_window(void)
{
    return yama_scope() == 1;
}

/* ---- the peer's side ---- */

struct kvp_te_lease {
    const kvp_data_te_lease_regions_t *area;
    kvp_data_te_lease_slot_t *slot;
    uint64_t gen;           /* the generation regions were read at; odd: none read yet */
    uint64_t (*regions)[2]; /* our copy of the target's */
    size_t n, cap;
};

/* fd's memfd of exactly size bytes with at least seals, mapped with prot; NULL: not. */
static void *memfd_map(int fd, size_t size, int seals, int prot)
{
    struct stat st;
    int got = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != size || got < 0 || (got & seals) != seals)
        return NULL;
    void *m = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
    return m == MAP_FAILED ? NULL : m;
}

kvp_status_t kvp_te_lease_map(int regions_fd, int slot_fd, kvp_te_lease_t **l_p)
{
    *l_p = NULL;
    const kvp_data_te_lease_regions_t *area =
        memfd_map(regions_fd, sizeof(*area), F_SEAL_SHRINK | F_SEAL_GROW, PROT_READ);
    kvp_data_te_lease_slot_t *slot =
        memfd_map(slot_fd, sizeof(*slot), F_SEAL_SHRINK | F_SEAL_GROW, PROT_READ | PROT_WRITE);
    close(regions_fd);
    close(slot_fd);
    kvp_te_lease_t *l = NULL;
    kvp_status_t st = KVP_ERR_PROTOCOL;
    if (area != NULL && slot != NULL && area->magic == KVP_TE_LEASE_MAGIC &&
        slot->magic == KVP_TE_SLOT_MAGIC) {
        st = (l = calloc(1, sizeof(*l))) != NULL ? KVP_OK : KVP_ERR_NOMEM;
    }
    if (st != KVP_OK) {
        if (area != NULL)
            munmap((void *)area, sizeof(*area));
        if (slot != NULL)
            munmap(slot, sizeof(*slot));
        return st;
    }
    l->area = area;
    l->slot = slot;
    l->gen = 1;
    *l_p = l;
    return KVP_OK;
}

void kvp_te_lease_unmap(kvp_te_lease_t *l)
{
    if (l == NULL)
        return;
    munmap((void *)l->area, sizeof(*l->area));
    munmap(l->slot, sizeof(*l->slot));
    free(l->regions);
    free(l);
}

/* The target's ranges as of a stable generation, into our copy (allocates only when they
 * grew). false: out of memory, or the target kept rewriting them. */
static bool lease_read(kvp_te_lease_t *l)
{
    for (int tries = 0; tries < 10000; tries++) {
        uint64_t g1 = LOAD(&l->area->gen);
        if (g1 & 1) {
            sched_yield();
            continue;
        }
        uint64_t n = LOAD(&l->area->n_regions);
        if (n > KVP_TE_LEASE_REGIONS)
            n = 0; /* torn: the generation check below retries */
        if (n > l->cap) {
            void *r = realloc(l->regions, n * sizeof(l->regions[0]));
            if (r == NULL)
                return false;
            l->regions = r;
            l->cap = n;
        }
        if (n > 0)
            memcpy(l->regions, l->area->regions, n * sizeof(l->regions[0]));
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (LOAD(&l->area->gen) == g1) {
            l->n = n;
            l->gen = g1;
            return true;
        }
    }
    return false;
}

/* Is [a, a + len) inside one of our copy's ranges? */
static bool lease_inside(const kvp_te_lease_t *l, uint64_t a, uint64_t len)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) { /* the last range starting at or below a */
        size_t mid = lo + (hi - lo) / 2;
        if (l->regions[mid][0] <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return false;
    uint64_t ra = l->regions[lo - 1][0], rl = l->regions[lo - 1][1];
    return a - ra <= rl && len <= rl - (a - ra);
}

kvp_te_lease_go_t kvp_te_lease_begin(kvp_te_lease_t *l, const uint64_t *remotes,
                                     const uint64_t *lens, size_t n)
{
    for (int tries = 0; tries < 100; tries++) {
        if ((l->gen & 1) && !lease_read(l))
            return KVP_TE_LEASE_ASK;
        STORE(&l->slot->state, l->gen << 1 | 1);
        if (LOAD(&l->slot->revoked) != 0) {
            STORE(&l->slot->state, l->gen << 1);
            return KVP_TE_LEASE_REVOKED;
        }
        if (LOAD(&l->area->gen) != l->gen) { /* changed: unmark, read them again */
            STORE(&l->slot->state, l->gen << 1);
            l->gen |= 1;
            continue;
        }
        for (size_t i = 0; i < n; i++)
            if (!lease_inside(l, remotes[i], lens[i])) {
                STORE(&l->slot->state, l->gen << 1);
                return KVP_TE_LEASE_ASK;
            }
        return KVP_TE_LEASE_GO;
    }
    return KVP_TE_LEASE_ASK;
}

void kvp_te_lease_end(kvp_te_lease_t *l, bool moved, int opcode, size_t n, uint64_t bytes)
{
    STORE(&l->slot->state, l->gen << 1);
    if (moved && (opcode == KVP_TE_READ || opcode == KVP_TE_WRITE)) {
        __atomic_fetch_add(&l->slot->moved[opcode], (uint64_t)n, __ATOMIC_RELAXED);
        __atomic_fetch_add(&l->slot->bytes[opcode], bytes, __ATOMIC_RELAXED);
    }
}
