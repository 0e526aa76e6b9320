/*
 * te_copy.c - the transfer engine's same-host copy (te_copy.h).
 *
 * Where the time goes (kvpool-bench te, shm, perf): the kernel's copy in process_vm_writev
 * (_copy_from_iter, a page at a time) and the pinning of the target's pages
 * (__get_user_pages, follow_page_pte), not the round trip that asks the target to check the
 * ranges. One thread copies about as fast as the kernel's copy goes; a batch of a few MiB or
 * more is split by bytes over the caller and the helpers, each part in calls of up to
 * IOV_MAX ranges (the target's memory stays registered until the caller answers, te.c).
 * The caller, its part done, waits for the helpers awake for up to COPY_SPIN_NS before it
 * sleeps (when each of them is copying; one not yet woken may need the caller's CPU): on a
 * 2-vCPU VM a sleeping thread's wake-up cost 50-60 us, a third of a 2 MiB batch, and with
 * the wait kvpool-bench te's shm 64 KiB x 32 went from 68-84 % of memcpy to 96-132 % (five
 * runs each way, alternated); larger batches, where the copy is the time, did not move.
 */
#include "client/te/te_copy.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "common/clock.h"

#define COPY_THREADS_MAX 8
#define COPY_IOV 1024              /* IOV_MAX: iovecs per process_vm_* call */
#define COPY_CALL_MAX (1ull << 30) /* bytes per call (the kernel moves < 2 GiB a call) */
#define COPY_PART_MIN (1ull << 20) /* a part is at least this many bytes */
#define COPY_SPIN_NS 200000u       /* the caller waits awake for the helpers this long */

typedef struct copy_part {
    size_t first;       /* its first range */
    uint64_t first_off; /* and where in it */
    uint64_t bytes;
    int err;
} copy_part_t;

typedef struct copy_helper {
    struct kvp_te_copy *c;
    unsigned h;   /* its part: 1 .. threads-1 */
    uint64_t gen; /* the job generation when it was created */
} copy_helper_t;

struct kvp_te_copy {
    unsigned threads;
    copy_helper_t helpers[COPY_THREADS_MAX];
    pthread_mutex_t use; /* the batch that has the helpers */
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    pthread_t tid[COPY_THREADS_MAX];
    unsigned started;
    bool stop;
    uint64_t gen;
    atomic_uint pending; /* helpers still on their parts (changed under lock) */
    atomic_uint running; /* helpers that took up the job (changed under lock) */
    unsigned k;
    /* the job */
    pid_t pid;
    bool write;
    void *const *locals;
    const uint64_t *remotes, *lens;
    size_t n;
    copy_part_t parts[COPY_THREADS_MAX];
};

/* One part: its bytes from its first range on, IOV_MAX ranges and COPY_CALL_MAX bytes a call. */
static int part_copy(pid_t pid, bool write, void *const *locals, const uint64_t *remotes,
                     const uint64_t *lens, size_t n, const copy_part_t *p)
{
    struct iovec l[COPY_IOV], r[COPY_IOV];
    size_t i = p->first;
    uint64_t off = p->first_off, left = p->bytes;
    while (left > 0) {
        size_t k = 0;
        uint64_t chunk = 0;
        while (k < COPY_IOV && chunk < left && chunk < COPY_CALL_MAX && i < n) {
            uint64_t take = lens[i] - off;
            if (take > left - chunk)
                take = left - chunk;
            if (take > COPY_CALL_MAX - chunk)
                take = COPY_CALL_MAX - chunk;
            l[k] = (struct iovec){.iov_base = (char *)locals[i] + off, .iov_len = take};
            r[k] =
                (struct iovec){.iov_base = (void *)(uintptr_t)(remotes[i] + off), .iov_len = take};
            k++;
            chunk += take;
            off += take;
            if (off == lens[i]) {
                i++;
                off = 0;
            }
        }
        if (k == 0)
            return EINVAL; /* the ranges hold fewer bytes than the part */
        ssize_t got =
            write ? process_vm_writev(pid, l, k, r, k, 0) : process_vm_readv(pid, l, k, r, k, 0);
        if (got < 0)
            return errno;
        if ((uint64_t)got != chunk)
            return EFAULT;
        left -= chunk;
    }
    return 0;
}

/* A spinning thread's hint to the CPU (its sibling hyperthread goes on). */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *helper_main(void *arg)
{
    const copy_helper_t *me = arg;
    kvp_te_copy_t *c = me->c;
    unsigned h = me->h;
    pthread_mutex_lock(&c->lock);
    uint64_t seen = me->gen; /* a job posted before it ran is still its */
    for (;;) {
        while (c->gen == seen && !c->stop)
            pthread_cond_wait(&c->go, &c->lock);
        if (c->stop)
            break;
        seen = c->gen;
        if (h >= c->k)
            continue;
        atomic_fetch_add(&c->running, 1);
        pthread_mutex_unlock(&c->lock);
        int err = part_copy(c->pid, c->write, c->locals, c->remotes, c->lens, c->n, &c->parts[h]);
        pthread_mutex_lock(&c->lock);
        c->parts[h].err = err;
        if (--c->pending == 0)
            pthread_cond_signal(&c->done);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

kvp_te_copy_t *kvp_te_copy_create(unsigned threads)
{
    kvp_te_copy_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->threads = threads < 1 ? 1 : threads > COPY_THREADS_MAX ? COPY_THREADS_MAX : threads;
    pthread_mutex_init(&c->use, NULL);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->go, NULL);
    pthread_cond_init(&c->done, NULL);
    return c;
}

void kvp_te_copy_destroy(kvp_te_copy_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->go);
    unsigned started = c->started;
    pthread_mutex_unlock(&c->lock);
    for (unsigned i = 0; i < started; i++)
        pthread_join(c->tid[i], NULL);
    pthread_cond_destroy(&c->go);
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->use);
    free(c);
}

int kvp_te_copy_run(kvp_te_copy_t *c, pid_t pid, bool write, void *const *locals,
                    const uint64_t *remotes, const uint64_t *lens, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += lens[i];
    unsigned k = c->threads;
    while (k > 1 && total / k < COPY_PART_MIN)
        k--;
    copy_part_t whole = {.bytes = total};
    if (k <= 1 || pthread_mutex_trylock(&c->use) != 0)
        return part_copy(pid, write, locals, remotes, lens, n, &whole);
    pthread_mutex_lock(&c->lock);
    while (c->started + 1 < k) { /* helper h is tid[h-1] */
        c->started++;
        c->helpers[c->started] = (copy_helper_t){.c = c, .h = c->started, .gen = c->gen};
        if (pthread_create(&c->tid[c->started - 1], NULL, helper_main, &c->helpers[c->started]) !=
            0) {
            c->started--;
            break;
        }
    }
    if (k > c->started + 1)
        k = c->started + 1;
    /* parts of total / k bytes (the last the rest), each from where the one before ends */
    uint64_t q = total / k, cum = 0;
    size_t i = 0;
    for (unsigned p = 0; p < k; p++) {
        uint64_t start = (uint64_t)p * q;
        while (i < n && cum + lens[i] <= start)
            cum += lens[i++];
        c->parts[p] = (copy_part_t){
            .first = i, .first_off = start - cum, .bytes = p + 1 == k ? total - start : q};
    }
    c->pid = pid;
    c->write = write;
    c->locals = locals;
    c->remotes = remotes;
    c->lens = lens;
    c->n = n;
    c->k = k;
    c->pending = k - 1;
    c->running = 0;
    c->gen++;
    pthread_cond_broadcast(&c->go);
    pthread_mutex_unlock(&c->lock);
    int err = part_copy(pid, write, locals, remotes, lens, n, &c->parts[0]);
    /* helpers still copying, every one of them on a CPU: wait for them awake a while
     * before sleeping (a sleeping thread's wake-up costs a VM tens of us, a batch of 2 MiB
     * about 150 in all). One that has not taken the job up yet may need this CPU (more
     * helpers than CPUs): then sleep at once. */
    if (atomic_load(&c->pending) > 0) {
        uint64_t until = kvp_now_ns() + COPY_SPIN_NS;
        for (unsigned spins = 1; atomic_load(&c->pending) > 0 && atomic_load(&c->running) == k - 1;
             spins++) {
            cpu_relax();
            if (spins % 64 == 0 && kvp_now_ns() > until)
                break;
        }
    }
    pthread_mutex_lock(&c->lock);
    while (atomic_load(&c->pending) > 0)
        pthread_cond_wait(&c->done, &c->lock);
    for (unsigned p = 1; p < k && err == 0; p++)
        err = c->parts[p].err;
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&c->use);
    return err;
}
