/*
 * dfs.c - the DFS tier's client side: the shared directory's id and the transport that
 * moves DFS replicas' bytes in the shard files themselves.
 *
 * Design (docs/architecture.md, "The DFS tier"):
 *   - A DFS directory holds an id file (KVP_DFS_ID_FILE, 128 random bits in hex, made
 *     once by whoever sees the directory first) and the shard files of the DFS segments
 *     mounted there (kvpool serve --dfs-path DIR --dfs-size N: one SSD-format file each,
 *     ssd_file.c). A DFS segment's name carries the directory's id and its shard's file
 *     name, so a client proves it sees the same directory (its own DIR has that id) before
 *     it touches a file there; a client of another directory, or none, reads and writes
 *     through the owner's data server like an SSD segment.
 *   - The transport takes only such peers (attach: the name parses, the id is ours, the
 *     file opens and has a valid header); it is created before the list (engine.h
 *     `first`), so forcing another transport keeps it. Its ops become io_uring reads and
 *     writes (ssd_io.c, a ring per thread) of the shard file at the extent's place, in
 *     page-cache mode (the callers' buffers are anyone's); a batch that wrote syncs each
 *     file it wrote (fdatasync) before it returns, so a put ends only once its DFS bytes
 *     are durable, as the owner's record then says. CRC32C as every transport.
 *   - Who may: whoever may open the directory's files. The data grants of an owner do not
 *     reach a file read in place: the directory's permissions are the DFS tier's access
 *     control (docs/security.md), so they are checked (common/private_path.h): the directory
 *     given must be this user's, mode 0700 or narrower, and so every kvpool file in it,
 *     0600 (the id file, its temporary copies, the shard files), or kvp_dfs_dir_id refuses
 *     it (KVP_ERR_DENIED, said how to fix) before anything is made or read there, owner or
 *     reader; what kvpool makes there is 0600 whatever the umask (explicit mode, fchmod),
 *     and kvpool makes no directory (a missing mount must not become a local one). Nodes
 *     sharing one directory run as the same uid. A shard found loose at attach is read
 *     through its owner.
 *
 * Thread: create/destroy on the client's thread; attach under the peer's tp_lock; submit
 * from any thread at once (a ring per thread, made on first use).
 */
#include "client/ssd/dfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/ssd/ssd_file.h"
#include "client/ssd/ssd_io.h"
#include "client/transfer/engine.h"
#include "client/transfer/peer.h"
#include "common/log.h"
#include "common/private_path.h"
#include "common/rand.h"

typedef struct dfs_ctx {
    char dir[1024];
    char id[KVP_DFS_ID_LEN + 1];
    unsigned index;
    pthread_key_t ring; /* this thread's kvp_ssd_io_t */
} dfs_ctx_t;

typedef struct dfs_peer {
    int fd;
    uint64_t data_base, size;
} dfs_peer_t;

static bool hex_id(const char *s)
{
    for (int i = 0; i < KVP_DFS_ID_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* A file kvpool makes in a DFS directory: the id file, its temporary copies
 * ("kvpool-dfs.id.<hex>"), the shard files ("shard-<host>-<k>.kvpdfs", client.c). */
static bool kvpool_file(const char *name)
{
    size_t n = strlen(name), id = strlen(KVP_DFS_ID_FILE);
    if (strncmp(name, KVP_DFS_ID_FILE, id) == 0 && (name[id] == '\0' || name[id] == '.'))
        return true;
    return n > 13 && strncmp(name, "shard-", 6) == 0 && strcmp(name + n - 7, ".kvpdfs") == 0;
}

/* Every kvpool file in the directory dfd (`dir`): this user's, no bit for group or others
 * (KVP_ERR_DENIED, why: the first that is not, and the fix). Other names are not ours to
 * judge; one that goes while we look is skipped. */
static kvp_status_t files_private(int dfd, const char *dir, char *why, size_t why_len)
{
    int lfd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (d == NULL) {
        snprintf(why, why_len, "cannot list the DFS directory %s: %s", dir, strerror(errno));
        if (lfd >= 0)
            close(lfd);
        return KVP_ERR_SYSTEM;
    }
    kvp_status_t st = KVP_OK;
    for (struct dirent *e; st == KVP_OK && (e = readdir(d)) != NULL;) {
        struct stat sb;
        if (!kvpool_file(e->d_name))
            continue;
        char path[1300];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (fstatat(dfd, e->d_name, &sb, 0) != 0) {
            if (errno == ENOENT)
                continue;
            snprintf(why, why_len, "cannot stat %s: %s", path, strerror(errno));
            st = KVP_ERR_SYSTEM;
        } else {
            st = kvp_private_path_check(&sb, "DFS file", path, why, why_len);
        }
    }
    closedir(d);
    return st;
}

/* The id of the directory dfd (`dir`, path the id file's) into id: read, or drawn and
 * written whole under a temporary name (mode 0600), then linked in (a process that lost
 * the race reads the winner's). */
static kvp_status_t read_or_make_id(int dfd, const char *path, char *id, char *why, size_t why_len)
{
    for (int attempt = 0; attempt < 50; attempt++) {
        int fd = openat(dfd, KVP_DFS_ID_FILE, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char buf[KVP_DFS_ID_LEN + 2] = {0};
            ssize_t got = read(fd, buf, sizeof(buf) - 1);
            close(fd);
            if (got == KVP_DFS_ID_LEN + 1 && buf[KVP_DFS_ID_LEN] == '\n' && hex_id(buf)) {
                memcpy(id, buf, KVP_DFS_ID_LEN);
                id[KVP_DFS_ID_LEN] = '\0';
                return KVP_OK;
            }
            if (got >= 0 && got < KVP_DFS_ID_LEN + 1) { /* being written by another process */
                usleep(10000);
                continue;
            }
            snprintf(why, why_len, "%s is not a kvpool DFS id file (left untouched)", path);
            return KVP_ERR_INVALID_ARG;
        }
        if (errno != ENOENT) {
            snprintf(why, why_len, "cannot read %s: %s", path, strerror(errno));
            return KVP_ERR_SYSTEM;
        }
        char tmp[64], line[KVP_DFS_ID_LEN + 2];
        uint64_t a = kvp_random_u64(), b = kvp_random_u64();
        snprintf(line, sizeof(line), "%016llx%016llx\n", (unsigned long long)a,
                 (unsigned long long)b);
        snprintf(tmp, sizeof(tmp), "%s.%016llx", KVP_DFS_ID_FILE, (unsigned long long)a);
        fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, KVP_PRIVATE_FILE_MODE);
        if (fd < 0) {
            snprintf(why, why_len, "cannot create %s.%016llx: %s", path, (unsigned long long)a,
                     strerror(errno));
            return KVP_ERR_SYSTEM;
        }
        /* 0600 whatever the umask (it narrows only) */
        errno = EIO; /* (a short write sets none) */
        bool ok = fchmod(fd, KVP_PRIVATE_FILE_MODE) == 0 &&
                  write(fd, line, KVP_DFS_ID_LEN + 1) == KVP_DFS_ID_LEN + 1 && fsync(fd) == 0;
        int err = errno;
        close(fd);
        if (ok && linkat(dfd, tmp, dfd, KVP_DFS_ID_FILE, 0) != 0 && errno != EEXIST) {
            ok = false;
            err = errno;
        }
        unlinkat(dfd, tmp, 0);
        if (!ok) {
            snprintf(why, why_len, "cannot create %s: %s", path, strerror(err));
            return KVP_ERR_SYSTEM;
        }
    }
    snprintf(why, why_len, "%s stays incomplete", path);
    return KVP_ERR_SYSTEM;
}

kvp_status_t kvp_dfs_dir_id(const char *dir, char *id, char *why, size_t why_len)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        bool absent = errno == ENOENT || errno == ENOTDIR;
        if (absent)
            snprintf(why, why_len, "DFS path %s is not a directory", dir);
        else
            snprintf(why, why_len, "cannot open the DFS directory %s: %s", dir, strerror(errno));
        return absent ? KVP_ERR_INVALID_ARG : KVP_ERR_SYSTEM;
    }
    /* the directory first: nothing is made in one others may read or write */
    struct stat sb;
    kvp_status_t st = KVP_OK;
    if (fstat(dfd, &sb) != 0) {
        snprintf(why, why_len, "cannot stat the DFS directory %s: %s", dir, strerror(errno));
        st = KVP_ERR_SYSTEM;
    }
    if (st == KVP_OK)
        st = kvp_private_path_check(&sb, "DFS directory", dir, why, why_len);
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", dir, KVP_DFS_ID_FILE);
    if (st == KVP_OK) /* then what is there: nothing is made beside a looser file */
        st = files_private(dfd, dir, why, why_len);
    if (st == KVP_OK)
        st = read_or_make_id(dfd, path, id, why, why_len);
    close(dfd);
    return st;
}

static void ring_free(void *io)
{
    kvp_ssd_io_destroy(io);
}

static kvp_status_t dfs_create(kvp_transfer_t *xfer, unsigned index, void **ctx_p)
{
    dfs_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVP_ERR_NOMEM;
    snprintf(c->dir, sizeof(c->dir), "%s", xfer->dfs_dir);
    c->index = index;
    kvp_status_t st = kvp_dfs_dir_id(c->dir, c->id, xfer->why, sizeof(xfer->why));
    if (st == KVP_OK && pthread_key_create(&c->ring, ring_free) != 0)
        st = KVP_ERR_SYSTEM;
    if (st != KVP_OK) {
        free(c);
        return st;
    }
    *ctx_p = c;
    return KVP_OK;
}

static void dfs_destroy(void *ctx)
{
    dfs_ctx_t *c = ctx;
    kvp_ssd_io_t *io = pthread_getspecific(c->ring);
    if (io != NULL) { /* this thread's; other threads' went with them */
        pthread_setspecific(c->ring, NULL);
        kvp_ssd_io_destroy(io);
    }
    pthread_key_delete(c->ring);
    free(c);
}

/* The shard file a DFS segment's name points to in our directory (file[256]); false: not a
 * DFS segment of our directory. */
static bool our_shard(const dfs_ctx_t *c, const char *name, char *file)
{
    const char *tag = strstr(name, KVP_DFS_NAME_TAG);
    if (tag == NULL)
        return false;
    const char *id = tag + strlen(KVP_DFS_NAME_TAG);
    if (strlen(id) < KVP_DFS_ID_LEN + 2 || memcmp(id, c->id, KVP_DFS_ID_LEN) != 0 ||
        id[KVP_DFS_ID_LEN] != '/')
        return false;
    const char *f = id + KVP_DFS_ID_LEN + 1;
    if (f[0] == '.' || strchr(f, '/') != NULL || strlen(f) > 255)
        return false;
    snprintf(file, 256, "%s", f);
    return true;
}

static kvp_status_t dfs_attach(void *ctx, kvp_peer_t *peer, void **state_p)
{
    dfs_ctx_t *c = ctx;
    char file[256], path[1300];
    if (!peer->dfs || !our_shard(c, peer->name, file))
        return KVP_ERR_TRANSPORT;
    snprintf(path, sizeof(path), "%s/%s", c->dir, file);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        KVP_LOG_WARN("DFS segment %s: cannot open %s (%s): read through its owner", peer->name,
                     path, strerror(errno));
        return KVP_ERR_TRANSPORT;
    }
    /* a shard others may read or write never gets our bytes (created since our start) */
    struct stat sb;
    char why[4352] = "fstat failed"; /* (the path three times at most) */
    if (fstat(fd, &sb) != 0 ||
        kvp_private_path_check(&sb, "DFS shard file", path, why, sizeof(why)) != KVP_OK) {
        KVP_LOG_WARN("DFS segment %s: %s: read through its owner", peer->name, why);
        close(fd);
        return KVP_ERR_TRANSPORT;
    }
    dfs_peer_t *p = calloc(1, sizeof(*p));
    uint64_t base = 0, size = 0;
    kvp_status_t st = p != NULL ? kvp_ssd_file_peek(fd, &base, &size) : KVP_ERR_NOMEM;
    if (st != KVP_OK || size < peer->size) {
        KVP_LOG_WARN("DFS segment %s: %s is not its shard file (%s): read through its owner",
                     peer->name, path, st != KVP_OK ? kvp_strerror(st) : "smaller");
        free(p);
        close(fd);
        return KVP_ERR_TRANSPORT;
    }
    p->fd = fd;
    p->data_base = base;
    p->size = size;
    *state_p = p;
    return KVP_OK;
}

static void dfs_detach(void *ctx, kvp_peer_t *peer, void *state)
{
    (void)ctx;
    (void)peer;
    dfs_peer_t *p = state;
    if (p != NULL) {
        close(p->fd);
        free(p);
    }
}

static void dfs_submit(void *ctx, kvp_xfer_op_t **ops, size_t n)
{
    dfs_ctx_t *c = ctx;
    kvp_ssd_io_t *io = pthread_getspecific(c->ring);
    kvp_status_t st = KVP_OK;
    if (io == NULL) {
        st = kvp_ssd_io_create(KVP_SSD_IO_DEPTH, &io);
        if (st == KVP_OK && pthread_setspecific(c->ring, io) != 0) {
            kvp_ssd_io_destroy(io);
            st = KVP_ERR_SYSTEM;
        }
    }
    kvp_ssd_iov_t *iov = st == KVP_OK ? calloc(n ? n : 1, sizeof(*iov)) : NULL;
    size_t *idx = iov != NULL ? calloc(n ? n : 1, sizeof(*idx)) : NULL;
    if (idx == NULL) {
        free(iov);
        for (size_t i = 0; i < n; i++)
            ops[i]->status = st != KVP_OK ? st : KVP_ERR_NOMEM;
        return;
    }
    kvp_xfer_crc_writes(ops, n);
    /* one direction and one file per io_uring batch, in the order given */
    for (size_t i = 0; i < n;) {
        dfs_peer_t *p = ops[i]->peer->tp_state[c->index];
        bool write = ops[i]->kind == KVP_XFER_WRITE;
        size_t j = i, k = 0;
        for (; j < n && ops[j]->peer->tp_state[c->index] == p &&
               (ops[j]->kind == KVP_XFER_WRITE) == write;
             j++) {
            kvp_xfer_op_t *op = ops[j];
            if (op->offset > p->size || op->length > p->size - op->offset) {
                op->status = KVP_ERR_OUT_OF_RANGE;
                continue;
            }
            idx[k] = j;
            iov[k++] = (kvp_ssd_iov_t){
                .buf = op->local, .file_off = p->data_base + op->offset, .len = op->length};
        }
        if (k > 0)
            kvp_ssd_io_rw(io, p->fd, write, iov, k);
        kvp_status_t sync = write && k > 0 ? kvp_ssd_io_datasync(io, p->fd) : KVP_OK;
        for (size_t m = 0; m < k; m++)
            ops[idx[m]]->status = iov[m].status != KVP_OK ? iov[m].status : sync;
        i = j;
    }
    free(idx);
    free(iov);
    kvp_xfer_crc_reads(ops, n);
}

const kvp_transport_ops_t kvp_transport_dfs_ops = {
    .name = "dfs",
    .id = KVP_TRANSPORT_DFS,
    .create = dfs_create,
    .destroy = dfs_destroy,
    .attach = dfs_attach,
    .detach = dfs_detach,
    .submit = dfs_submit,
};
