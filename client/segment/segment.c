/*
 * segment.c - this client's own DRAM segment (segment.h): a memfd (or a
 * range of a file the user names: Mooncake's mount_segment) mapped
 * MAP_POPULATE (the memory is really there once mounted, and no put pays a
 * first-touch page fault), served over tcp by its data server and over the
 * engine's serving transports (rdma), with its record of objects and its
 * state at the master.
 *
 * Thread: create/stop/destroy on the client's creating/destroying thread; the
 * accessors from any thread (atomics). state_lock orders a remount against a
 * drain's MOUNTED -> DRAINING, so the id a drain reads is the one it drains.
 */
#include "client/segment/segment.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/grant.h"
#include "common/log.h"
#include "common/private_path.h"

struct kvp_segment {
    int fd;
    void *base;
    uint64_t size;
    uint64_t client_id;
    bool keep_dumpable; /* params.keep_dumpable: seal_process leaves it dumpable */
    char name[300];
    char endpoint[280];
    char shm_path[64];
    char host_id[128];
    char rdma_endpoint[64]; /* "" when the segment is not served over rdma */
    uint64_t rdma_addr;
    uint32_t rdma_rkey;
    kvp_data_server_t *server;
    kvp_transfer_t *xfer;          /* the client's engine: its serving transports (rdma) */
    struct kvp_seg_record *record; /* kept current by the record thread (control/) */

    pthread_mutex_t state_lock;
    _Atomic int state;         /* KVP_SEG_* */
    _Atomic uint64_t id;       /* at the master */
    _Atomic uint64_t offer_id; /* a mount whose record is still to be offered */
    _Atomic uint64_t open_id;  /* the last mount whose offer ended (the segment open) */
};

/* Why create failed, for the caller's last error (and the log). */
static void __attribute__((format(printf, 2, 3)))
create_fail(const kvp_segment_params_t *p, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    KVP_LOG_ERROR("segment: %s", buf);
    if (p->err != NULL && p->err_len > 0)
        snprintf(p->err, p->err_len, "%s", buf);
}

/* The memory of a memfd of `size` bytes. */
static kvp_status_t memfd_open(kvp_segment_t *seg, const kvp_segment_params_t *p)
{
    seg->fd = memfd_create("kvpool-segment", MFD_CLOEXEC);
    if (seg->fd < 0)
        return kvp_status_from_errno(errno);
    if (ftruncate(seg->fd, (off_t)seg->size) != 0) {
        kvp_status_t st = kvp_status_from_errno(errno);
        create_fail(p, "cannot size a %llu-byte segment: %s", (unsigned long long)seg->size,
                    strerror(errno));
        return st;
    }
    return KVP_OK;
}

/* The memory of [file_offset, file_offset + size) of params->file, checked: a regular file
 * of this user's that nobody else may read or write (its permissions are the segment's), the
 * range inside it and page-aligned. *whole_p: the range is the whole file. */
static kvp_status_t file_open(kvp_segment_t *seg, const kvp_segment_params_t *p, bool *whole_p)
{
    seg->fd = open(p->file, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (seg->fd < 0) {
        /* a path that is not there is a bad argument (NOT_FOUND is a key's) */
        bool bad_path = errno == ENOENT || errno == ELOOP || errno == EISDIR || errno == ENOTDIR;
        kvp_status_t st = bad_path ? KVP_ERR_INVALID_ARG : kvp_status_from_errno(errno);
        create_fail(p, "segment file %s: %s", p->file,
                    errno == ELOOP ? "a symbolic link (name the file itself)" : strerror(errno));
        return st;
    }
    struct stat sb;
    if (fstat(seg->fd, &sb) != 0) {
        kvp_status_t st = kvp_status_from_errno(errno);
        create_fail(p, "segment file %s: %s", p->file, strerror(errno));
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        create_fail(p, "segment file %s is not a regular file", p->file);
        return KVP_ERR_INVALID_ARG;
    }
    char why[512];
    if (kvp_private_path_check(&sb, "segment file", p->file, why, sizeof(why)) != KVP_OK) {
        create_fail(p, "%s", why);
        return KVP_ERR_DENIED;
    }
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t fsize = (uint64_t)sb.st_size;
    if (p->file_offset % page != 0) {
        create_fail(p, "segment file %s: offset %llu is not a multiple of the page size (%llu)",
                    p->file, (unsigned long long)p->file_offset, (unsigned long long)page);
        return KVP_ERR_INVALID_ARG;
    }
    if (p->file_offset > fsize || seg->size > fsize - p->file_offset) {
        create_fail(p, "segment file %s: [%llu, +%llu) runs past its end (%llu bytes)", p->file,
                    (unsigned long long)p->file_offset, (unsigned long long)seg->size,
                    (unsigned long long)fsize);
        return KVP_ERR_INVALID_ARG;
    }
    *whole_p = p->file_offset == 0 && seg->size == fsize;
    return KVP_OK;
}

/* The memory: a memfd or a file's range, mapped shared and faulted in. */
static kvp_status_t memory_create(kvp_segment_t *seg, const kvp_segment_params_t *p)
{
    bool shareable = true;
    kvp_status_t st = p->file != NULL ? file_open(seg, p, &shareable) : memfd_open(seg, p);
    if (st != KVP_OK)
        return st;
    off_t off = p->file != NULL ? (off_t)p->file_offset : 0;
    void *base =
        mmap(NULL, seg->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, seg->fd, off);
    if (base == MAP_FAILED) {
        st = kvp_status_from_errno(errno);
        create_fail(p, "cannot map a %llu-byte segment: %s", (unsigned long long)seg->size,
                    strerror(errno));
        return st;
    }
    seg->base = base;
    if (!shareable) { /* the descriptor would open more than the segment: peers use tcp */
        KVP_LOG_INFO("segment: %s is part of its file; same-host peers will use tcp", p->file);
        return KVP_OK;
    }
    /* same-host peers ask for the memory on this abstract Unix socket (data_server.c):
     * a name nobody can guess ahead, so nobody can squat it */
    uint8_t rnd[8];
    if (!kvp_grant_random(rnd, sizeof(rnd)))
        return KVP_ERR_SYSTEM;
    int n = snprintf(seg->shm_path, sizeof(seg->shm_path), "@kvpool-%d-", (int)getpid());
    for (size_t i = 0; i < sizeof(rnd); i++)
        n += snprintf(seg->shm_path + n, sizeof(seg->shm_path) - (size_t)n, "%02x", rnd[i]);
    return KVP_OK;
}

/* The data server's rdma windows: the engine's serving transport binds them. */
static kvp_status_t windows_of(void *xfer, uint32_t qp_num, uint64_t tag, const uint64_t *offs,
                               const uint64_t *lens, size_t n_bind, bool write, uint64_t expiry_ms,
                               uint32_t *rkeys, uint32_t *slots, size_t n_unbind)
{
    return kvp_transfer_windows(xfer, qp_num, tag, offs, lens, n_bind, write, expiry_ms, rkeys,
                                slots, n_unbind);
}

/* Serve it: its tcp data server on host:port, then the engine's serving transports. */
static kvp_status_t serve(kvp_segment_t *seg, const kvp_segment_params_t *p)
{
    const char *host = p->data_host ? p->data_host : "127.0.0.1";
    uint16_t port;
    kvp_status_t st = kvp_segment_server_create(seg->base, seg->size, host, p->data_port,
                                                p->protected_mode, &seg->server, &port);
    if (st != KVP_OK)
        return st;
    snprintf(seg->endpoint, sizeof(seg->endpoint), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
             port);
    st = seg->shm_path[0] != '\0' ? kvp_data_server_share(seg->server, seg->fd, seg->shm_path + 1)
                                  : KVP_OK;
    if (st != KVP_OK) { /* no shm for it: same-host peers use tcp */
        KVP_LOG_WARN("segment: cannot listen on a Unix socket for same-host peers (%s); they "
                     "will use tcp",
                     kvp_strerror(st));
        seg->shm_path[0] = '\0';
    }
    st = kvp_transfer_serve_segment(p->xfer, seg->base, seg->size, seg->rdma_endpoint,
                                    sizeof(seg->rdma_endpoint), &seg->rdma_addr, &seg->rdma_rkey);
    if (st == KVP_OK && p->xfer->seg_windows)
        kvp_data_server_set_windows(seg->server, windows_of, p->xfer);
    return st;
}

kvp_status_t kvp_segment_create(const kvp_segment_params_t *params, kvp_segment_t **seg_p)
{
    kvp_segment_t *seg = calloc(1, sizeof(*seg));
    if (seg == NULL)
        return KVP_ERR_NOMEM;
    seg->fd = -1;
    seg->size = params->size;
    seg->client_id = params->client_id;
    seg->xfer = params->xfer;
    seg->keep_dumpable = params->keep_dumpable;
    snprintf(seg->host_id, sizeof(seg->host_id), "%s", params->xfer->host_id);
    pthread_mutex_init(&seg->state_lock, NULL);
    kvp_status_t st = kvp_seg_record_create(&seg->record);
    if (st == KVP_OK)
        st = memory_create(seg, params);
    if (st == KVP_OK)
        st = serve(seg, params);
    if (st == KVP_OK) {
        kvp_seg_record_set_memory(seg->record, seg->base, seg->size);
        kvp_segment_server_set_record(seg->server, seg->record);
    }
    if (st != KVP_OK) {
        kvp_segment_destroy(seg);
        return st;
    }
    snprintf(seg->name, sizeof(seg->name), "%s",
             params->name != NULL ? params->name : seg->endpoint);
    atomic_store(&seg->state, KVP_SEG_MOUNTED);
    *seg_p = seg;
    return KVP_OK;
}

void kvp_segment_stop(kvp_segment_t *seg)
{
    if (seg == NULL)
        return;
    if (seg->record != NULL) /* the record thread may still apply: not into a freed table */
        kvp_seg_record_set_pending(seg->record, NULL);
    kvp_data_server_destroy(seg->server);
    seg->server = NULL;
}

void kvp_segment_destroy(kvp_segment_t *seg)
{
    if (seg == NULL)
        return;
    kvp_segment_stop(seg);
    kvp_seg_record_destroy(seg->record);
    if (seg->base != NULL)
        munmap(seg->base, seg->size);
    if (seg->fd >= 0)
        close(seg->fd);
    pthread_mutex_destroy(&seg->state_lock);
    free(seg);
}

void *kvp_segment_base(const kvp_segment_t *seg)
{
    return seg->base;
}

uint64_t kvp_segment_size(const kvp_segment_t *seg)
{
    return seg->size;
}

const char *kvp_segment_name(const kvp_segment_t *seg)
{
    return seg->name;
}

uint64_t kvp_segment_id(const kvp_segment_t *seg)
{
    return atomic_load(&seg->id);
}

int kvp_segment_state(const kvp_segment_t *seg)
{
    return seg != NULL ? atomic_load(&seg->state) : KVP_SEG_NONE;
}

struct kvp_seg_record *kvp_segment_record(const kvp_segment_t *seg)
{
    return seg->record;
}

const kvp_served_stats_t *kvp_segment_served(const kvp_segment_t *seg)
{
    return seg->server != NULL ? kvp_data_server_stats(seg->server) : NULL;
}

uint64_t kvp_segment_grants_refused(const kvp_segment_t *seg)
{
    return seg->server != NULL ? kvp_data_server_grants_refused(seg->server) : 0;
}

uint64_t kvp_segment_shm_refused(const kvp_segment_t *seg)
{
    return seg->server != NULL ? kvp_data_server_map_refused(seg->server) : 0;
}

uint64_t kvp_segment_refused(const kvp_segment_t *seg)
{
    return seg->server != NULL ? kvp_data_server_refused(seg->server) : 0;
}

void kvp_segment_admission(const kvp_segment_t *seg, kvp_conn_refusals_t *sum)
{
    kvp_data_server_admission(seg->server, sum);
}

void *kvp_segment_extent(const kvp_segment_t *seg, uint64_t offset, uint64_t length)
{
    if (offset > seg->size || length > seg->size - offset)
        return NULL;
    return (char *)seg->base + offset;
}

void kvp_segment_proof_secret(kvp_segment_t *seg, uint8_t secret[KVP_PROVE_SECRET_LEN])
{
    kvp_data_server_proof(seg->server, seg->name, secret);
}

void kvp_segment_describe(const kvp_segment_t *seg, Kvpool__SegmentDesc *d)
{
    d->name = (char *)seg->name;
    d->medium = "dram";
    d->size = seg->size;
    d->owner_client_id = seg->client_id;
    d->host_id = (char *)seg->host_id;
    d->tcp_endpoint = (char *)seg->endpoint;
    d->shm_path = (char *)seg->shm_path;
    d->rdma_endpoint = (char *)seg->rdma_endpoint;
    d->rdma_addr = seg->rdma_addr;
    d->rdma_rkey = seg->rdma_rkey;
    d->rdma_windows = seg->xfer != NULL && seg->xfer->seg_windows;
}

void kvp_segment_state_lock(kvp_segment_t *seg)
{
    pthread_mutex_lock(&seg->state_lock);
}

void kvp_segment_state_unlock(kvp_segment_t *seg)
{
    pthread_mutex_unlock(&seg->state_lock);
}

/*
 * Data grants on: the segment is handed only to peers that may have all of it (MAP), so
 * its memfd must not be reachable another way. A process of our user could otherwise open
 * it through /proc/<pid>/fd/<n> (or ptrace us and read it): not dumpable, our /proc
 * entries are root's and ptrace needs CAP_SYS_PTRACE. Also no core dumps of this process,
 * and debuggers need root. KVPOOL_KEEP_DUMPABLE=1 (read by the client, client/env.c:
 * `keep`) keeps it dumpable (docs/security.md).
 */
static void seal_process(bool keep)
{
    if (keep) {
        KVP_LOG_WARN_LIMITED("KVPOOL_KEEP_DUMPABLE=1: any process of this user can open this "
                             "process's segment through /proc");
        return;
    }
    if (prctl(PR_GET_DUMPABLE) != 0 && prctl(PR_SET_DUMPABLE, 0) != 0)
        KVP_LOG_WARN("segment: cannot make this process undumpable (%m): processes of its "
                     "user can open its segment through /proc");
}

void kvp_segment_mounted(kvp_segment_t *seg, uint64_t seg_id, bool adopting,
                         const uint8_t *grant_key, size_t grant_key_len, uint64_t grant_epoch)
{
    if (adopting) /* flagged before the id changes: the record thread sees both */
        atomic_store(&seg->offer_id, seg_id);
    /* the new key before the new id: no request for the new mount is served unchecked */
    if (seg->server != NULL)
        kvp_data_server_set_grants(seg->server, grant_key, grant_key_len, grant_epoch);
    kvp_grant_keyring_set(&seg->xfer->seg_grants, grant_key, grant_key_len, grant_epoch);
    if (grant_key != NULL)
        seal_process(seg->keep_dumpable);
    atomic_store(&seg->id, seg_id);
    kvp_data_server_set_id(seg->server, seg_id);
    KVP_LOG_INFO("mounted segment %s (%llu bytes) as %#llx", seg->name,
                 (unsigned long long)seg->size, (unsigned long long)seg_id);
}

kvp_status_t kvp_segment_drain_begin(kvp_segment_t *seg, uint64_t *seg_id_p)
{
    pthread_mutex_lock(&seg->state_lock);
    int expect = KVP_SEG_MOUNTED;
    bool ok = atomic_compare_exchange_strong(&seg->state, &expect, KVP_SEG_DRAINING);
    uint64_t seg_id = atomic_load(&seg->id);
    pthread_mutex_unlock(&seg->state_lock);
    if (!ok)
        return expect == KVP_SEG_DRAINING ? KVP_ERR_PENDING : KVP_ERR_INVALID_ARG;
    *seg_id_p = seg_id;
    return KVP_OK;
}

bool kvp_segment_drain_abort(kvp_segment_t *seg)
{
    kvp_segment_state_lock(seg);
    int expect = KVP_SEG_DRAINING;
    bool ok = atomic_compare_exchange_strong(&seg->state, &expect, KVP_SEG_MOUNTED);
    kvp_segment_state_unlock(seg);
    return ok;
}

int kvp_segment_set_drained(kvp_segment_t *seg)
{
    return atomic_exchange(&seg->state, KVP_SEG_DRAINED);
}

uint64_t kvp_segment_offer_take(kvp_segment_t *seg)
{
    return atomic_exchange(&seg->offer_id, 0);
}

bool kvp_segment_offer_waiting(const kvp_segment_t *seg)
{
    return atomic_load(&seg->offer_id) != 0;
}

void kvp_segment_set_open(kvp_segment_t *seg, uint64_t seg_id)
{
    atomic_store(&seg->open_id, seg_id);
}

bool kvp_segment_is_open(const kvp_segment_t *seg)
{
    uint64_t id = atomic_load(&seg->id);
    return id != 0 && atomic_load(&seg->open_id) == id;
}
