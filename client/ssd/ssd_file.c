/*
 * ssd_file.c - an SSD segment's file: the segment's bytes and the table of
 * the objects in them, in one preallocated file that survives restarts.
 *
 * File format (version 1; all integers little-endian, blocks of 4 KiB):
 *
 *   block 0, block 1   two identical copies of the header, written once when
 *                      the file is created; open uses the first copy that
 *                      verifies. Header (the rest of the block is zero):
 *                        0  magic "KVPSSD01"         8 bytes
 *                        8  format version (1)       u32
 *                       12  block size (4096)        u32
 *                       16  data size (segment bytes, multiple of 4096)  u64
 *                       24  max_entries (table slots)                     u32
 *                       28  reserved (0)             u32
 *                       32  table offset (8192)      u64
 *                       40  data base = table offset + max_entries * 4096 u64
 *                       48  file id (random)         16 bytes
 *                       64  creation time, ns since the Unix epoch        u64
 *                       72  reserved (0)             u32
 *                       76  CRC32C of bytes 0..75    u32
 *   object table       max_entries slots of one block each, from the table
 *                      offset. Slot (the rest of the block is zero):
 *                        0  magic 0x4550564B ("KVPE")                     u32
 *                        4  entry format version (1) u16
 *                        6  key_len (1..4000)        u16
 *                        8  object version (the master's; never 0)        u64
 *                       16  extent offset in the segment (4 KiB multiple) u64
 *                       24  object size (>= 1)       u64
 *                       32  CRC32C of the object's bytes                  u32
 *                       36  CRC32C of the file id, then bytes 0..35, then the key  u32
 *                       40  key bytes
 *                      A slot is live when magic, format and CRC verify, the
 *                      offset is 4 KiB aligned, offset + size <= data size and
 *                      key_len is in range; any other slot (zero, torn,
 *                      garbage, another file's) is free. The file id in the
 *                      CRC keeps a slot copied from another file from passing.
 *   data area          from the data base (4 KiB aligned): segment byte 0 is
 *                      file byte data_base; extents are whole 4 KiB blocks.
 *
 * Creating: open with O_CREAT|O_EXCL, mode 0600 set again with fchmod (the
 * umask does not matter); an existing file is opened instead, and refused
 * (KVP_ERR_DENIED, untouched) when it is another user's or its group or
 * others have any permission bit: the file's permissions are its objects'
 * (common/private_path.h, as the DRAM segment's --segment-file). One of
 * size 0 is formatted too: fallocate the whole file (the table reads
 * as zeros: every slot free), write both header copies, fsync the file and
 * its directory. Nothing but an empty or new file is ever formatted.
 *
 * Recording (kvp_ssd_file_record): the data is made durable first
 * (fdatasync); each entry is then written, as one aligned 4 KiB write, to a
 * FREE slot (a live slot is never overwritten in place), the slots are made
 * durable (fdatasync), and only then are older entries whose extents
 * overlap a new one forgotten: their slots are zeroed (not synced). A crash
 * at any point leaves the old entry, the new one, or both; at open, of
 * entries whose extents overlap only the highest (version, slot index)
 * survives: an entry is dropped when any entry overlapping it ranks higher,
 * and dropped slots are zeroed on the file.
 *
 * Opening: O_DIRECT is required (a filesystem that refuses it, or tmpfs and
 * ramfs, which accept it with no disk behind, give KVP_ERR_UNSUPPORTED)
 * unless buffered_io is asked for. The file is flock()ed (exclusive, non
 * blocking) until close, so a second process gets KVP_ERR_IN_USE. The whole
 * table is read through io_uring in 1 MiB reads, KVP_SSD_IO_DEPTH in flight.
 *
 * In memory: an entry per slot (the key copied, so lookups and foreach never
 * read the file), a stack of free slots, a hash from extent offset to slot
 * (lookup, forget) and a treap of the live entries ordered by offset (the
 * overlap queries of record). Live extents never overlap outside record.
 *
 * Thread: any; one mutex guards the table and the file's own ring (record,
 * forget and recovery I/O run under it). The data area's I/O is the
 * caller's, on its own ring.
 */
#include "client/ssd/ssd_file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "client/ssd/ssd_io.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/private_path.h"
#include "common/rand.h"

#define SSD_MAGIC "KVPSSD01"
#define SSD_FORMAT_VERSION 1u
#define SSD_ENTRY_MAGIC 0x4550564Bu /* "KVPE" little-endian */
#define SSD_ENTRY_VERSION 1u
#define SSD_TABLE_OFF (2ull * KVP_SSD_BLOCK)
#define SSD_MAX_ENTRIES_LIMIT (1u << 24)
#define SSD_DEFAULT_BYTES_PER_ENTRY (64u << 10)
#define SSD_DEFAULT_MIN_ENTRIES 1024u
#define SSD_SLOT_BATCH 64u /* slots written per ring batch in record */
#define NONE UINT32_MAX

typedef struct ssd_header {
    char magic[8];
    uint32_t format_version;
    uint32_t block;
    uint64_t data_size;
    uint32_t max_entries;
    uint32_t reserved0;
    uint64_t table_offset;
    uint64_t data_base;
    uint8_t file_id[16];
    uint64_t created_ns;
    uint32_t reserved1;
    uint32_t crc32c;
} ssd_header_t;

typedef struct ssd_slot {
    uint32_t magic;
    uint16_t format;
    uint16_t key_len;
    uint64_t version;
    uint64_t offset;
    uint64_t size;
    uint32_t data_crc;
    uint32_t crc32c;
    char key[];
} ssd_slot_t;

_Static_assert(sizeof(ssd_header_t) == 80, "header layout");
_Static_assert(offsetof(ssd_header_t, crc32c) == 76, "header layout");
_Static_assert(offsetof(ssd_slot_t, crc32c) == 36, "slot layout");
_Static_assert(offsetof(ssd_slot_t, key) == 40, "slot layout");
_Static_assert(40 + KVP_SSD_KEY_MAX <= KVP_SSD_BLOCK, "a slot holds the longest key");

typedef struct ssd_ent {
    uint64_t version;
    uint64_t offset;
    uint64_t size;
    char *key;
    uint32_t crc32c;
    uint16_t key_len;
    bool live;
    uint32_t left, right; /* treap children */
} ssd_ent_t;

struct kvp_ssd_file {
    pthread_mutex_t lock;
    int fd;
    bool direct;
    char *path;
    uint64_t data_size;
    uint64_t data_base;
    uint32_t max_entries;
    uint8_t file_id[16];
    uint32_t id_crc;             /* CRC32C of file_id: the seed of every slot's CRC */
    kvp_ssd_io_stats_t io_stats; /* every ring on this file counts here */
    kvp_ssd_io_t *io;
    uint8_t *blk;  /* SSD_SLOT_BATCH blocks for slot images */
    uint8_t *zero; /* one zero block */
    kvp_ssd_iov_t ops[SSD_SLOT_BATCH];
    ssd_ent_t *ent;    /* [max_entries] */
    uint32_t *free_st; /* free slots; the top is free_st[n_free - 1] */
    uint32_t n_free;
    uint32_t *hash; /* extent offset -> slot, linear probing; NONE: empty */
    uint64_t hash_mask;
    uint32_t root; /* treap of live entries by offset */
    size_t live;
};

static void set_why(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_why(char *why, size_t why_len, const char *fmt, ...)
{
    if (why == NULL || why_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

/* ---- the hash: extent offset -> slot ---- */

static uint64_t hash_home(const kvp_ssd_file_t *f, uint64_t offset)
{
    return ((offset / KVP_SSD_BLOCK) * 0x9E3779B97F4A7C15ull >> 20) & f->hash_mask;
}

static uint32_t hash_find(const kvp_ssd_file_t *f, uint64_t offset)
{
    for (uint64_t i = hash_home(f, offset);; i = (i + 1) & f->hash_mask) {
        uint32_t s = f->hash[i];
        if (s == NONE || f->ent[s].offset == offset)
            return s;
    }
}

static void hash_insert(kvp_ssd_file_t *f, uint32_t slot)
{
    uint64_t i = hash_home(f, f->ent[slot].offset);
    while (f->hash[i] != NONE)
        i = (i + 1) & f->hash_mask;
    f->hash[i] = slot;
}

/* Backward-shift deletion (Knuth 6.4 algorithm R): no tombstones. */
static void hash_remove(kvp_ssd_file_t *f, uint32_t slot)
{
    uint64_t i = hash_home(f, f->ent[slot].offset);
    while (f->hash[i] != slot)
        i = (i + 1) & f->hash_mask;
    for (;;) {
        f->hash[i] = NONE;
        uint64_t j = i;
        for (;;) {
            j = (j + 1) & f->hash_mask;
            if (f->hash[j] == NONE)
                return;
            uint64_t k = hash_home(f, f->ent[f->hash[j]].offset);
            bool movable = i <= j ? (k <= i || k > j) : (k <= i && k > j);
            if (movable) {
                f->hash[i] = f->hash[j];
                i = j;
                break;
            }
        }
    }
}

/* ---- the treap: live entries ordered by offset ---- */

static uint32_t prio(uint32_t slot)
{
    uint32_t x = slot * 0x9E3779B1u;
    x ^= x >> 15;
    x *= 0x85EBCA77u;
    x ^= x >> 13;
    return x;
}

/* l: the entries of t with offset < key, r: the others. */
static void treap_split(ssd_ent_t *e, uint32_t t, uint64_t key, uint32_t *l, uint32_t *r)
{
    if (t == NONE) {
        *l = *r = NONE;
    } else if (e[t].offset < key) {
        treap_split(e, e[t].right, key, &e[t].right, r);
        *l = t;
    } else {
        treap_split(e, e[t].left, key, l, &e[t].left);
        *r = t;
    }
}

/* Every offset in a is below every offset in b. */
static uint32_t treap_merge(ssd_ent_t *e, uint32_t a, uint32_t b)
{
    if (a == NONE)
        return b;
    if (b == NONE)
        return a;
    if (prio(a) > prio(b)) {
        e[a].right = treap_merge(e, e[a].right, b);
        return a;
    }
    e[b].left = treap_merge(e, a, e[b].left);
    return b;
}

static void treap_insert(kvp_ssd_file_t *f, uint32_t slot)
{
    uint32_t l, r;
    f->ent[slot].left = f->ent[slot].right = NONE;
    treap_split(f->ent, f->root, f->ent[slot].offset, &l, &r);
    f->root = treap_merge(f->ent, treap_merge(f->ent, l, slot), r);
}

static void treap_remove(kvp_ssd_file_t *f, uint32_t slot)
{
    uint32_t l, m, r;
    treap_split(f->ent, f->root, f->ent[slot].offset, &l, &r);
    treap_split(f->ent, r, f->ent[slot].offset + 1, &m, &r);
    f->root = treap_merge(f->ent, l, r);
}

/* The live entry with the greatest offset below `key`; NONE: none. */
static uint32_t treap_pred(const kvp_ssd_file_t *f, uint64_t key)
{
    uint32_t best = NONE;
    for (uint32_t t = f->root; t != NONE;) {
        if (f->ent[t].offset < key) {
            best = t;
            t = f->ent[t].right;
        } else {
            t = f->ent[t].left;
        }
    }
    return best;
}

/* ---- slots ---- */

static uint64_t slot_off(uint32_t slot)
{
    return SSD_TABLE_OFF + (uint64_t)slot * KVP_SSD_BLOCK;
}

static uint32_t slot_crc(const kvp_ssd_file_t *f, const ssd_slot_t *s)
{
    uint32_t crc = kvp_crc32c(f->id_crc, s, offsetof(ssd_slot_t, crc32c));
    return kvp_crc32c(crc, s->key, s->key_len);
}

/* Fill the block at `blk` with the slot image of e. */
static void slot_encode(const kvp_ssd_file_t *f, const kvp_ssd_entry_t *e, uint8_t *blk)
{
    memset(blk, 0, KVP_SSD_BLOCK);
    ssd_slot_t *s = (ssd_slot_t *)blk;
    s->magic = SSD_ENTRY_MAGIC;
    s->format = SSD_ENTRY_VERSION;
    s->key_len = e->key_len;
    s->version = e->version;
    s->offset = e->offset;
    s->size = e->size;
    s->data_crc = e->crc32c;
    memcpy(s->key, e->key, e->key_len);
    s->crc32c = slot_crc(f, s);
}

static bool slot_valid(const kvp_ssd_file_t *f, const ssd_slot_t *s)
{
    if (s->magic != SSD_ENTRY_MAGIC || s->format != SSD_ENTRY_VERSION || s->key_len == 0 ||
        s->key_len > KVP_SSD_KEY_MAX || s->version == 0 || s->size == 0 ||
        s->offset % KVP_SSD_BLOCK != 0 || s->offset > f->data_size ||
        s->size > f->data_size - s->offset)
        return false;
    return slot_crc(f, s) == s->crc32c;
}

/* Zero a slot on the file (one aligned block write, not synced). */
static kvp_status_t slot_clear(kvp_ssd_file_t *f, uint32_t slot)
{
    for (;;) {
        ssize_t n = pwrite(f->fd, f->zero, KVP_SSD_BLOCK, (off_t)slot_off(slot));
        if (n == (ssize_t)KVP_SSD_BLOCK)
            return KVP_OK;
        if (n < 0 && errno == EINTR)
            continue;
        KVP_LOG_WARN("ssd file %s: clearing slot %u failed: %s", f->path, slot,
                     n < 0 ? strerror(errno) : "short write");
        return KVP_ERR_IO;
    }
}

/* Drop a live entry from memory and give its slot back (the file is the caller's). */
static void ent_drop(kvp_ssd_file_t *f, uint32_t slot)
{
    ssd_ent_t *e = &f->ent[slot];
    hash_remove(f, slot);
    treap_remove(f, slot);
    free(e->key);
    e->key = NULL;
    e->live = false;
    f->live--;
    f->free_st[f->n_free++] = slot;
}

/* Forget every live entry whose extent overlaps [off, off+size): zero its slot, drop it.
 * Live extents do not overlap each other, so they are found walking down from `end`. */
static void forget_overlaps(kvp_ssd_file_t *f, uint64_t off, uint64_t size)
{
    for (uint32_t t = treap_pred(f, off + size); t != NONE; t = treap_pred(f, off + size)) {
        if (f->ent[t].offset + f->ent[t].size <= off)
            break;
        slot_clear(f, t);
        ent_drop(f, t);
    }
}

/* Make a free slot live with e's contents; key is taken over. */
static void ent_add(kvp_ssd_file_t *f, uint32_t slot, const kvp_ssd_entry_t *e, char *key)
{
    ssd_ent_t *x = &f->ent[slot];
    x->version = e->version;
    x->offset = e->offset;
    x->size = e->size;
    x->crc32c = e->crc32c;
    x->key_len = e->key_len;
    x->key = key;
    x->live = true;
    hash_insert(f, slot);
    treap_insert(f, slot);
    f->live++;
}

/* ---- open ---- */

static uint32_t header_crc(const ssd_header_t *h)
{
    return kvp_crc32c(0, h, offsetof(ssd_header_t, crc32c));
}

static bool header_valid(const ssd_header_t *h)
{
    if (memcmp(h->magic, SSD_MAGIC, 8) != 0 || h->crc32c != header_crc(h))
        return false;
    return h->format_version == SSD_FORMAT_VERSION && h->block == KVP_SSD_BLOCK &&
           h->table_offset == SSD_TABLE_OFF && h->max_entries >= 1 &&
           h->max_entries <= SSD_MAX_ENTRIES_LIMIT && h->data_size >= KVP_SSD_BLOCK &&
           h->data_size % KVP_SSD_BLOCK == 0 &&
           h->data_base == SSD_TABLE_OFF + (uint64_t)h->max_entries * KVP_SSD_BLOCK;
}

/*
 * The filesystem refused O_DIRECT (`what` says how): KVP_ERR_UNSUPPORTED, or with
 * buffered_io the fd goes on without it.
 */
static kvp_status_t refuse_direct(kvp_ssd_file_t *f, bool buffered_ok, const char *what, char *why,
                                  size_t why_len)
{
    if (!buffered_ok) {
        set_why(why, why_len,
                "%s: %s, and SSD segments need O_DIRECT: put the file on a disk filesystem "
                "(ext4, xfs) or allow buffered I/O (page cache)",
                f->path, what);
        return KVP_ERR_UNSUPPORTED;
    }
    int fl = fcntl(f->fd, F_GETFL);
    if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_DIRECT) < 0) {
        set_why(why, why_len, "%s: cannot turn O_DIRECT off: %s", f->path, strerror(errno));
        return KVP_ERR_SYSTEM;
    }
    f->direct = false;
    KVP_LOG_WARN("ssd file %s: %s; using buffered I/O (page cache) as configured", f->path, what);
    return KVP_OK;
}

/* pread/pwrite of whole aligned blocks; EINVAL with O_DIRECT is the filesystem refusing it. */
static kvp_status_t block_io(kvp_ssd_file_t *f, bool write, void *buf, size_t len, uint64_t off,
                             bool buffered_ok, char *why, size_t why_len)
{
    for (;;) {
        ssize_t n =
            write ? pwrite(f->fd, buf, len, (off_t)off) : pread(f->fd, buf, len, (off_t)off);
        if (n == (ssize_t)len)
            return KVP_OK;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EINVAL && f->direct) {
            kvp_status_t st =
                refuse_direct(f, buffered_ok, "the filesystem refuses O_DIRECT I/O", why, why_len);
            if (st != KVP_OK)
                return st;
            continue;
        }
        int err = n < 0 ? errno : EIO;
        set_why(why, why_len, "%s: %s of %zu bytes at %llu failed: %s", f->path,
                write ? "write" : "read", len, (unsigned long long)off,
                n < 0 ? strerror(err) : "short transfer");
        return err == ENOSPC || err == EDQUOT ? KVP_ERR_NO_SPACE
               : err == EIO                   ? KVP_ERR_IO
                                              : KVP_ERR_SYSTEM;
    }
}

static void fsync_dir(const char *path)
{
    char *copy = strdup(path);
    if (copy == NULL)
        return;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(copy);
}

/* Preallocate and write the headers of a new (or empty) file. */
static kvp_status_t format(kvp_ssd_file_t *f, bool buffered_ok, char *why, size_t why_len)
{
    uint64_t total = f->data_base + f->data_size;
    if (fallocate(f->fd, 0, 0, (off_t)total) != 0) {
        int err = errno;
        if (err == ENOSPC || err == EDQUOT) {
            set_why(why, why_len,
                    "%s: not enough room on its filesystem: the segment needs %llu bytes "
                    "(%llu of data, %llu of object table)",
                    f->path, (unsigned long long)total, (unsigned long long)f->data_size,
                    (unsigned long long)(f->data_base - SSD_TABLE_OFF));
            return KVP_ERR_NO_SPACE;
        }
        if (err == EOPNOTSUPP) {
            set_why(why, why_len, "%s: the filesystem cannot preallocate (fallocate)", f->path);
            return KVP_ERR_UNSUPPORTED;
        }
        set_why(why, why_len, "%s: fallocate of %llu bytes failed: %s", f->path,
                (unsigned long long)total, strerror(err));
        return KVP_ERR_SYSTEM;
    }
    uint8_t *b = f->blk; /* two blocks at least */
    memset(b, 0, 2 * KVP_SSD_BLOCK);
    /* The probe: an aligned read of block 0 (zeros) as the headers' write will be. */
    kvp_status_t st = block_io(f, false, b, KVP_SSD_BLOCK, 0, buffered_ok, why, why_len);
    if (st != KVP_OK)
        return st;
    ssd_header_t *h = (ssd_header_t *)b;
    memset(b, 0, 2 * KVP_SSD_BLOCK);
    memcpy(h->magic, SSD_MAGIC, 8);
    h->format_version = SSD_FORMAT_VERSION;
    h->block = KVP_SSD_BLOCK;
    h->data_size = f->data_size;
    h->max_entries = f->max_entries;
    h->table_offset = SSD_TABLE_OFF;
    h->data_base = f->data_base;
    memcpy(f->file_id, (uint64_t[2]){kvp_random_u64(), kvp_random_u64()}, 16);
    memcpy(h->file_id, f->file_id, 16);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    h->crc32c = header_crc(h);
    memcpy(b + KVP_SSD_BLOCK, b, KVP_SSD_BLOCK);
    st = block_io(f, true, b, 2 * KVP_SSD_BLOCK, 0, buffered_ok, why, why_len);
    if (st != KVP_OK)
        return st;
    if (fsync(f->fd) != 0) {
        set_why(why, why_len, "%s: fsync failed: %s", f->path, strerror(errno));
        return errno == EIO ? KVP_ERR_IO : KVP_ERR_SYSTEM;
    }
    fsync_dir(f->path);
    KVP_LOG_INFO("ssd file %s: created (%llu bytes of data, %u table slots)", f->path,
                 (unsigned long long)f->data_size, f->max_entries);
    return KVP_OK;
}

/* Read and check the headers of an existing file against what was asked. */
static kvp_status_t read_header(kvp_ssd_file_t *f, uint64_t file_size, bool buffered_ok, char *why,
                                size_t why_len)
{
    if (file_size < SSD_TABLE_OFF) {
        set_why(why, why_len,
                "%s is not a kvpool SSD file (%llu bytes, no header); it was left untouched",
                f->path, (unsigned long long)file_size);
        return KVP_ERR_INVALID_ARG;
    }
    kvp_status_t st = block_io(f, false, f->blk, 2 * KVP_SSD_BLOCK, 0, buffered_ok, why, why_len);
    if (st != KVP_OK)
        return st;
    const ssd_header_t *h = NULL;
    for (int copy = 0; copy < 2 && h == NULL; copy++) {
        const ssd_header_t *c = (const ssd_header_t *)(f->blk + copy * KVP_SSD_BLOCK);
        if (header_valid(c))
            h = c;
    }
    if (h != NULL && (const uint8_t *)h != f->blk)
        KVP_LOG_WARN("ssd file %s: the first header copy is damaged; opened with the second",
                     f->path);
    if (h == NULL) {
        set_why(why, why_len,
                "%s is not a kvpool SSD file (no valid header); it was left untouched", f->path);
        return KVP_ERR_INVALID_ARG;
    }
    if (h->data_size != f->data_size || h->max_entries != f->max_entries) {
        set_why(why, why_len,
                "%s holds a segment of %llu bytes with %u table slots, not the %llu bytes with %u "
                "slots asked for: use its size, or remove the file to start empty",
                f->path, (unsigned long long)h->data_size, h->max_entries,
                (unsigned long long)f->data_size, f->max_entries);
        return KVP_ERR_INVALID_ARG;
    }
    if (file_size < h->data_base + h->data_size) {
        set_why(why, why_len, "%s is truncated: %llu bytes, its header says %llu", f->path,
                (unsigned long long)file_size, (unsigned long long)(h->data_base + h->data_size));
        return KVP_ERR_INVALID_ARG;
    }
    memcpy(f->file_id, h->file_id, 16);
    return KVP_OK;
}

/* ---- recovery ---- */

/* Does slot a rank above slot b (higher version, then higher slot index)? */
static bool ranks_above(const ssd_ent_t *e, uint32_t a, uint32_t b)
{
    return e[a].version > e[b].version || (e[a].version == e[b].version && a > b);
}

static int by_offset(const void *a, const void *b, void *ents)
{
    const ssd_ent_t *e = ents;
    uint64_t x = e[*(const uint32_t *)a].offset;
    uint64_t y = e[*(const uint32_t *)b].offset;
    return x < y ? -1 : x > y;
}

static uint32_t better(const ssd_ent_t *e, uint32_t a, uint32_t b)
{
    if (a == NONE)
        return b;
    if (b == NONE)
        return a;
    return ranks_above(e, a, b) ? a : b;
}

/*
 * Of the m valid slots in cand[], mark dropped[k] those overlapped by a higher-ranked
 * one. Sorted by offset, the entries after k that overlap it are a contiguous run
 * (k, hi): a range query of the best rank over it says whether one beats k, and a range
 * update of "best seen" over it tells each of them whether k beats it. Both are
 * bottom-up segment trees over the sorted positions: O(m log m).
 */
static kvp_status_t resolve_overlaps(ssd_ent_t *e, uint32_t *cand, size_t m, bool *dropped)
{
    if (m < 2)
        return KVP_OK;
    qsort_r(cand, m, sizeof(cand[0]), by_offset, e);
    uint32_t *best = malloc(2 * m * sizeof(uint32_t));
    uint32_t *tag = malloc(2 * m * sizeof(uint32_t));
    if (best == NULL || tag == NULL) {
        free(best);
        free(tag);
        return KVP_ERR_NOMEM;
    }
    for (size_t k = 0; k < m; k++) {
        best[m + k] = cand[k];
        tag[m + k] = NONE;
    }
    for (size_t i = m - 1; i >= 1; i--) {
        best[i] = better(e, best[2 * i], best[2 * i + 1]);
        tag[i] = NONE;
    }
    for (size_t k = 0; k < m; k++) {
        uint64_t end = e[cand[k]].offset + e[cand[k]].size;
        size_t lo = k + 1, hi = m; /* first position at or after `end` */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (e[cand[mid]].offset < end)
                lo = mid + 1;
            else
                hi = mid;
        }
        uint32_t q = NONE;
        for (size_t l = k + 1 + m, r = hi + m; l < r; l >>= 1, r >>= 1) {
            if (l & 1) {
                q = better(e, q, best[l]);
                tag[l] = better(e, tag[l], cand[k]);
                l++;
            }
            if (r & 1) {
                r--;
                q = better(e, q, best[r]);
                tag[r] = better(e, tag[r], cand[k]);
            }
        }
        if (q != NONE && ranks_above(e, q, cand[k]))
            dropped[k] = true;
    }
    for (size_t k = 0; k < m; k++) {
        uint32_t t = NONE;
        for (size_t p = m + k; p >= 1; p >>= 1)
            t = better(e, t, tag[p]);
        if (t != NONE && ranks_above(e, t, cand[k]))
            dropped[k] = true;
    }
    free(best);
    free(tag);
    return KVP_OK;
}

/* Read the whole table, keep the valid slots, resolve overlaps, build the index. */
static kvp_status_t recover(kvp_ssd_file_t *f, char *why, size_t why_len)
{
    kvp_status_t st = KVP_ERR_NOMEM;
    uint64_t table_bytes = (uint64_t)f->max_entries * KVP_SSD_BLOCK;
    uint64_t buf_len = KVP_MIN(table_bytes, (uint64_t)KVP_SSD_IO_DEPTH * KVP_SSD_IO_CHUNK);
    uint8_t *buf = kvp_ssd_buf_alloc(buf_len);
    uint32_t *cand = malloc((size_t)f->max_entries * sizeof(uint32_t));
    bool *dropped = calloc(f->max_entries, sizeof(bool));
    size_t m = 0, garbage = 0, n_dropped = 0;
    kvp_ssd_iov_t ops[KVP_SSD_IO_DEPTH];
    if (buf == NULL || cand == NULL || dropped == NULL) {
        set_why(why, why_len, "%s: no memory to read the object table", f->path);
        goto out;
    }
    for (uint64_t at = 0; at < table_bytes; at += buf_len) {
        uint64_t len = KVP_MIN(buf_len, table_bytes - at);
        size_t n = 0;
        for (uint64_t o = 0; o < len; o += KVP_SSD_IO_CHUNK)
            ops[n++] = (kvp_ssd_iov_t){.buf = buf + o,
                                       .file_off = SSD_TABLE_OFF + at + o,
                                       .len = KVP_MIN((uint64_t)KVP_SSD_IO_CHUNK, len - o)};
        st = kvp_ssd_io_rw(f->io, f->fd, false, ops, n);
        if (st != KVP_OK) {
            set_why(why, why_len, "%s: reading the object table failed: %s", f->path,
                    kvp_strerror(st));
            goto out;
        }
        for (uint64_t o = 0; o < len; o += KVP_SSD_BLOCK) {
            const ssd_slot_t *s = (const ssd_slot_t *)(buf + o);
            uint32_t slot = (uint32_t)((at + o) / KVP_SSD_BLOCK);
            if (!slot_valid(f, s)) {
                static const uint8_t z[40];
                if (memcmp(s, z, sizeof(z)) != 0)
                    garbage++;
                continue;
            }
            char *key = malloc(s->key_len);
            if (key == NULL) {
                st = KVP_ERR_NOMEM;
                set_why(why, why_len, "%s: no memory for the recovered keys", f->path);
                goto out;
            }
            memcpy(key, s->key, s->key_len);
            f->ent[slot] = (ssd_ent_t){.version = s->version,
                                       .offset = s->offset,
                                       .size = s->size,
                                       .key = key,
                                       .crc32c = s->data_crc,
                                       .key_len = s->key_len};
            cand[m++] = slot;
        }
    }
    st = resolve_overlaps(f->ent, cand, m, dropped);
    if (st != KVP_OK) {
        set_why(why, why_len, "%s: no memory to check the recovered entries", f->path);
        goto out;
    }
    for (size_t k = 0; k < m; k++) {
        uint32_t slot = cand[k];
        if (dropped[k]) {
            slot_clear(f, slot);
            free(f->ent[slot].key);
            f->ent[slot].key = NULL;
            n_dropped++;
            continue;
        }
        f->ent[slot].live = true;
        hash_insert(f, slot);
        treap_insert(f, slot);
        f->live++;
    }
    for (uint32_t s = f->max_entries; s-- > 0;)
        if (!f->ent[s].live)
            f->free_st[f->n_free++] = s;
    KVP_LOG_INFO("ssd file %s: %zu entries recovered, %zu dropped (overlapped by a newer one), "
                 "%zu damaged slots ignored",
                 f->path, f->live, n_dropped, garbage);
    st = KVP_OK;
out:
    if (st != KVP_OK)
        for (size_t k = 0; k < m; k++) {
            free(f->ent[cand[k]].key);
            f->ent[cand[k]].key = NULL;
        }
    free(dropped);
    free(cand);
    free(buf);
    return st;
}

/* Open path (creating it exclusively if absent, mode 0600 whatever the umask: the file's
 * permissions are its objects'); *created_p: this call created it. */
static int open_path(const char *path, bool direct, bool *created_p)
{
    int flags = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
    for (;;) {
        int fd = open(path, flags | O_CREAT | O_EXCL, KVP_PRIVATE_FILE_MODE);
        if (fd >= 0) {
            /* (the umask narrows only; a filesystem that ignores the mode fails fd_check) */
            if (fchmod(fd, KVP_PRIVATE_FILE_MODE) != 0)
                KVP_LOG_WARN("ssd file %s: cannot chmod it 600: %m", path);
            *created_p = true;
            return fd;
        }
        if (errno != EEXIST)
            return -1;
        fd = open(path, flags);
        if (fd >= 0) {
            *created_p = false;
            return fd;
        }
        if (errno != ENOENT)
            return -1; /* else removed in between: create again */
    }
}

static kvp_status_t open_fd(kvp_ssd_file_t *f, bool buffered_ok, bool *created_p, char *why,
                            size_t why_len)
{
    f->direct = true;
    f->fd = open_path(f->path, true, created_p);
    if (f->fd < 0 && errno == EINVAL) {
        kvp_status_t st = KVP_ERR_UNSUPPORTED;
        if (!buffered_ok) {
            set_why(why, why_len,
                    "%s: the filesystem refuses O_DIRECT (open: EINVAL), and SSD segments need "
                    "it: put the file on a disk filesystem (ext4, xfs) or allow buffered I/O",
                    f->path);
            return st;
        }
        KVP_LOG_WARN("ssd file %s: the filesystem refuses O_DIRECT; using buffered I/O (page "
                     "cache) as configured",
                     f->path);
        f->direct = false;
        f->fd = open_path(f->path, false, created_p);
    }
    if (f->fd < 0) {
        int err = errno;
        set_why(why, why_len, "cannot open %s: %s", f->path, strerror(err));
        return err == ENOSPC || err == EDQUOT ? KVP_ERR_NO_SPACE
               : err == EIO                   ? KVP_ERR_IO
               : err == ENOENT || err == EISDIR || err == ENOTDIR || err == ENAMETOOLONG
                   ? KVP_ERR_INVALID_ARG
                   : KVP_ERR_SYSTEM;
    }
    return KVP_OK;
}

/* The in-memory tables and the struct (open's failure path and close). */
static void file_free(kvp_ssd_file_t *f)
{
    free(f->hash);
    free(f->free_st);
    free(f->ent);
    free(f->zero);
    free(f->blk);
    free(f->path);
    free(f);
}

/* A file handle for a segment of data_size bytes and max_entries object table slots, its
 * tables allocated (and the file not yet opened); NULL when out of memory. */
static kvp_ssd_file_t *file_alloc(const char *path, uint64_t data_size, uint64_t max_entries)
{
    kvp_ssd_file_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    f->fd = -1;
    f->root = NONE;
    f->data_size = data_size;
    f->max_entries = (uint32_t)max_entries;
    f->data_base = SSD_TABLE_OFF + max_entries * KVP_SSD_BLOCK;
    uint64_t hash_cap = 1;
    while (hash_cap < 2 * max_entries)
        hash_cap <<= 1;
    f->hash_mask = hash_cap - 1;
    f->path = strdup(path);
    f->blk = kvp_ssd_buf_alloc(SSD_SLOT_BATCH * KVP_SSD_BLOCK);
    f->zero = kvp_ssd_buf_alloc(KVP_SSD_BLOCK);
    f->ent = calloc(max_entries, sizeof(f->ent[0]));
    f->free_st = malloc(max_entries * sizeof(uint32_t));
    f->hash = malloc(hash_cap * sizeof(uint32_t));
    if (f->path == NULL || f->blk == NULL || f->zero == NULL || f->ent == NULL ||
        f->free_st == NULL || f->hash == NULL) {
        file_free(f);
        return NULL;
    }
    memset(f->zero, 0, KVP_SSD_BLOCK);
    memset(f->hash, 0xff, hash_cap * sizeof(uint32_t));
    return f;
}

/* Take the file's lock (one process mounts it at a time). */
static kvp_status_t fd_lock(kvp_ssd_file_t *f, const char *path, char *why, size_t why_len)
{
    if (flock(f->fd, LOCK_EX | LOCK_NB) == 0)
        return KVP_OK;
    if (errno == EWOULDBLOCK) {
        set_why(why, why_len, "%s is mounted by another live process", path);
        return KVP_ERR_IN_USE;
    }
    set_why(why, why_len, "%s: flock failed: %s", path, strerror(errno));
    return KVP_ERR_SYSTEM;
}

/* Check the open file can hold the segment: a regular file of this user's that nobody else
 * may read or write (KVP_ERR_DENIED, left untouched), on a disk when its I/O is O_DIRECT
 * (else refuse_direct decides). *size_p: its size. */
static kvp_status_t fd_check(kvp_ssd_file_t *f, const kvp_ssd_open_params_t *p, uint64_t *size_p,
                             char *why, size_t why_len)
{
    struct statfs sfs;
    if (f->direct && fstatfs(f->fd, &sfs) == 0 &&
        (sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC)) {
        /* Linux >= 6.6 accepts O_DIRECT on tmpfs, but there is no disk behind it. */
        kvp_status_t st = refuse_direct(
            f, p->buffered_io, "the file is on tmpfs/ramfs, which has no disk for O_DIRECT I/O",
            why, why_len);
        if (st != KVP_OK)
            return st;
    }
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        set_why(why, why_len, "%s: fstat failed: %s", p->path, strerror(errno));
        return KVP_ERR_SYSTEM;
    }
    if (!S_ISREG(sb.st_mode)) {
        set_why(why, why_len, "%s is not a regular file; it was left untouched", p->path);
        return KVP_ERR_INVALID_ARG;
    }
    kvp_status_t st =
        kvp_private_path_check(&sb, p->what ? p->what : "SSD segment file", p->path, why, why_len);
    if (st != KVP_OK)
        return st;
    *size_p = (uint64_t)sb.st_size;
    return KVP_OK;
}

kvp_status_t kvp_ssd_file_open(const kvp_ssd_open_params_t *p, kvp_ssd_file_t **f_p, char *why,
                               size_t why_len)
{
    set_why(why, why_len, "%s", "");
    if (p == NULL || p->path == NULL || p->path[0] == '\0') {
        set_why(why, why_len, "no path given for the SSD segment file");
        return KVP_ERR_INVALID_ARG;
    }
    uint64_t data_size = p->size / KVP_SSD_BLOCK * KVP_SSD_BLOCK;
    if (data_size == 0) {
        set_why(why, why_len, "%s: segment size %llu is below one block (%u bytes)", p->path,
                (unsigned long long)p->size, KVP_SSD_BLOCK);
        return KVP_ERR_INVALID_ARG;
    }
    uint64_t max_entries = p->max_entries;
    if (max_entries == 0)
        max_entries = KVP_MAX(data_size / SSD_DEFAULT_BYTES_PER_ENTRY, SSD_DEFAULT_MIN_ENTRIES);
    if (max_entries > SSD_MAX_ENTRIES_LIMIT) {
        set_why(why, why_len, "%s: %llu object table slots asked for, at most %u", p->path,
                (unsigned long long)max_entries, SSD_MAX_ENTRIES_LIMIT);
        return KVP_ERR_INVALID_ARG;
    }

    kvp_status_t st = KVP_ERR_NOMEM;
    kvp_ssd_file_t *f = file_alloc(p->path, data_size, max_entries);
    if (f == NULL)
        goto err_nomem;
    st = kvp_ssd_io_create(KVP_SSD_IO_DEPTH, &f->io);
    if (st != KVP_OK) {
        set_why(why, why_len, "%s: cannot create an io_uring (%s)", p->path, kvp_strerror(st));
        goto err_free;
    }
    kvp_ssd_io_set_stats(f->io, &f->io_stats);
    pthread_mutex_init(&f->lock, NULL);

    bool created = false;
    st = open_fd(f, p->buffered_io, &created, why, why_len);
    if (st != KVP_OK)
        goto err_destroy;
    st = fd_lock(f, p->path, why, why_len);
    if (st != KVP_OK) {
        created = false; /* another process may have it now: never remove it */
        goto err_close;
    }
    uint64_t size;
    st = fd_check(f, p, &size, why, why_len);
    if (st != KVP_OK)
        goto err_close;
    bool formatting = size == 0;
    if (formatting) {
        st = format(f, p->buffered_io, why, why_len);
        if (st != KVP_OK)
            goto err_unformat;
        for (uint32_t s = f->max_entries; s-- > 0;)
            f->free_st[f->n_free++] = s;
    } else {
        st = read_header(f, size, p->buffered_io, why, why_len);
        if (st != KVP_OK)
            goto err_close;
    }
    f->id_crc = kvp_crc32c(0, f->file_id, sizeof(f->file_id));
    if (!formatting) {
        st = recover(f, why, why_len);
        if (st != KVP_OK)
            goto err_close;
    }
    *f_p = f;
    return KVP_OK;

err_unformat:
    /* leave the path as it was: absent, or empty */
    if (created)
        unlink(p->path);
    else if (ftruncate(f->fd, 0) != 0)
        KVP_LOG_WARN("ssd file %s: cannot truncate it back to empty: %m", p->path);
    created = false;
err_close:
    if (created)
        unlink(p->path);
    close(f->fd);
err_destroy:
    pthread_mutex_destroy(&f->lock);
    kvp_ssd_io_destroy(f->io);
err_free:
    file_free(f);
err_nomem:
    if (st == KVP_ERR_NOMEM)
        set_why(why, why_len, "%s: out of memory for the object table (%llu slots)", p->path,
                (unsigned long long)max_entries);
    return st;
}

kvp_status_t kvp_ssd_file_peek(int fd, uint64_t *data_base_p, uint64_t *data_size_p)
{
    uint8_t blk[2 * KVP_SSD_BLOCK];
    ssize_t got = pread(fd, blk, sizeof(blk), 0);
    if (got != (ssize_t)sizeof(blk))
        return got < 0 ? KVP_ERR_IO : KVP_ERR_INVALID_ARG;
    for (int copy = 0; copy < 2; copy++) {
        ssd_header_t h;
        memcpy(&h, blk + copy * KVP_SSD_BLOCK, sizeof(h));
        if (header_valid(&h)) {
            struct stat sb;
            if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < h.data_base + h.data_size)
                return KVP_ERR_INVALID_ARG;
            *data_base_p = h.data_base;
            *data_size_p = h.data_size;
            return KVP_OK;
        }
    }
    return KVP_ERR_INVALID_ARG;
}

void kvp_ssd_file_close(kvp_ssd_file_t *f)
{
    if (f == NULL)
        return;
    for (uint32_t s = 0; s < f->max_entries; s++)
        free(f->ent[s].key);
    close(f->fd); /* releases the flock */
    kvp_ssd_io_destroy(f->io);
    pthread_mutex_destroy(&f->lock);
    file_free(f);
}

kvp_ssd_io_stats_t *kvp_ssd_file_io_stats(kvp_ssd_file_t *f)
{
    return &f->io_stats;
}

int kvp_ssd_file_fd(const kvp_ssd_file_t *f)
{
    return f->fd;
}

uint64_t kvp_ssd_file_data_base(const kvp_ssd_file_t *f)
{
    return f->data_base;
}

uint64_t kvp_ssd_file_size(const kvp_ssd_file_t *f)
{
    return f->data_size;
}

bool kvp_ssd_file_direct(const kvp_ssd_file_t *f)
{
    return f->direct;
}

const char *kvp_ssd_file_path(const kvp_ssd_file_t *f)
{
    return f->path;
}

uint32_t kvp_ssd_file_max_entries(const kvp_ssd_file_t *f)
{
    return f->max_entries;
}

size_t kvp_ssd_file_count(kvp_ssd_file_t *f)
{
    pthread_mutex_lock(&f->lock);
    size_t n = f->live;
    pthread_mutex_unlock(&f->lock);
    return n;
}

static void to_entry(const ssd_ent_t *x, kvp_ssd_entry_t *e)
{
    *e = (kvp_ssd_entry_t){.version = x->version,
                           .offset = x->offset,
                           .size = x->size,
                           .crc32c = x->crc32c,
                           .key_len = x->key_len,
                           .key = x->key};
}

/* In offset order; the recursion is as deep as the treap (O(log n) expected). */
static void foreach_in(const ssd_ent_t *ent, uint32_t t,
                       void (*cb)(const kvp_ssd_entry_t *e, void *arg), void *arg)
{
    while (t != NONE) {
        foreach_in(ent, ent[t].left, cb, arg);
        kvp_ssd_entry_t e;
        to_entry(&ent[t], &e);
        cb(&e, arg);
        t = ent[t].right;
    }
}

void kvp_ssd_file_foreach(kvp_ssd_file_t *f, void (*cb)(const kvp_ssd_entry_t *e, void *arg),
                          void *arg)
{
    pthread_mutex_lock(&f->lock);
    foreach_in(f->ent, f->root, cb, arg);
    pthread_mutex_unlock(&f->lock);
}

uint64_t kvp_ssd_file_version_at(kvp_ssd_file_t *f, uint64_t offset)
{
    uint64_t v;
    kvp_ssd_file_versions_at(f, &offset, &v, 1);
    return v;
}

void kvp_ssd_file_versions_at(kvp_ssd_file_t *f, const uint64_t *offsets, uint64_t *versions,
                              size_t n)
{
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < n; i++) {
        uint32_t s = i > 0 && offsets[i] == offsets[i - 1] ? NONE : hash_find(f, offsets[i]);
        versions[i] = i > 0 && offsets[i] == offsets[i - 1] ? versions[i - 1]
                      : s != NONE                           ? f->ent[s].version
                                                            : 0;
    }
    pthread_mutex_unlock(&f->lock);
}

bool kvp_ssd_file_lookup(kvp_ssd_file_t *f, uint64_t offset, kvp_ssd_entry_t *e, char *key_buf)
{
    pthread_mutex_lock(&f->lock);
    uint32_t s = hash_find(f, offset);
    if (s != NONE) {
        to_entry(&f->ent[s], e);
        memcpy(key_buf, f->ent[s].key, f->ent[s].key_len);
        e->key = key_buf;
    }
    pthread_mutex_unlock(&f->lock);
    return s != NONE;
}

kvp_status_t kvp_ssd_file_forget(kvp_ssd_file_t *f, uint64_t offset, uint64_t version)
{
    pthread_mutex_lock(&f->lock);
    uint32_t s = hash_find(f, offset);
    if (s == NONE || (version != 0 && f->ent[s].version != version)) {
        pthread_mutex_unlock(&f->lock);
        return KVP_ERR_NOT_FOUND;
    }
    /* A failed clear is logged: the entry may come back after a restart, which the
     * master's version check and the read's CRC make harmless. */
    slot_clear(f, s);
    ent_drop(f, s);
    pthread_mutex_unlock(&f->lock);
    return KVP_OK;
}

static kvp_status_t check_entry(const kvp_ssd_file_t *f, const kvp_ssd_entry_t *e)
{
    if (e->version == 0 || e->size == 0 || e->offset % KVP_SSD_BLOCK != 0 ||
        e->offset > f->data_size || e->size > f->data_size - e->offset || e->key_len == 0 ||
        e->key_len > KVP_SSD_KEY_MAX || e->key == NULL)
        return KVP_ERR_INVALID_ARG;
    return KVP_OK;
}

/* Record entries[0..n) (n <= SSD_SLOT_BATCH, already checked: st[i] == KVP_OK) under the
 * lock; st[i] gets each one's outcome. */
static void record_batch(kvp_ssd_file_t *f, const kvp_ssd_entry_t *entries, size_t n,
                         kvp_status_t *st)
{
    uint32_t slot[SSD_SLOT_BATCH];
    char *key[SSD_SLOT_BATCH];
    size_t nops = 0;
    int op_of[SSD_SLOT_BATCH];
    for (size_t i = 0; i < n; i++) {
        op_of[i] = -1;
        if (st[i] != KVP_OK)
            continue;
        if (f->n_free == 0) {
            st[i] = KVP_ERR_NO_SPACE;
            continue;
        }
        key[i] = malloc(entries[i].key_len);
        if (key[i] == NULL) {
            st[i] = KVP_ERR_NOMEM;
            continue;
        }
        memcpy(key[i], entries[i].key, entries[i].key_len);
        slot[i] = f->free_st[--f->n_free];
        slot_encode(f, &entries[i], f->blk + nops * KVP_SSD_BLOCK);
        f->ops[nops] = (kvp_ssd_iov_t){.buf = f->blk + nops * KVP_SSD_BLOCK,
                                       .file_off = slot_off(slot[i]),
                                       .len = KVP_SSD_BLOCK};
        op_of[i] = (int)nops++;
    }
    if (nops == 0)
        return;
    kvp_ssd_io_rw(f->io, f->fd, true, f->ops, nops);
    kvp_status_t sync = kvp_ssd_io_datasync(f->io, f->fd);
    for (size_t i = 0; i < n; i++) {
        if (op_of[i] < 0)
            continue;
        kvp_status_t s = f->ops[op_of[i]].status;
        if (s == KVP_OK)
            s = sync;
        if (s != KVP_OK) {
            /* its slot may hold it or not: clear it (a crash may still bring it back,
             * with bytes the caller will write again or forget) and give it back */
            st[i] = s == KVP_ERR_NO_SPACE ? KVP_ERR_NO_SPACE : KVP_ERR_IO;
            slot_clear(f, slot[i]);
            f->free_st[f->n_free++] = slot[i];
            free(key[i]);
            continue;
        }
        forget_overlaps(f, entries[i].offset, entries[i].size);
        ent_add(f, slot[i], &entries[i], key[i]);
    }
}

kvp_status_t kvp_ssd_file_record(kvp_ssd_file_t *f, const kvp_ssd_entry_t *entries, size_t n,
                                 kvp_status_t *statuses)
{
    kvp_status_t first = KVP_OK;
    bool any = false;
    for (size_t i = 0; i < n; i++)
        any |= check_entry(f, &entries[i]) == KVP_OK;
    /* The data first: an entry must never be durable before its bytes are. */
    kvp_status_t data_sync = KVP_OK;
    if (any && fdatasync(f->fd) != 0) {
        KVP_LOG_WARN("ssd file %s: fdatasync of the data failed: %m", f->path);
        data_sync = errno == ENOSPC ? KVP_ERR_NO_SPACE : KVP_ERR_IO;
    }
    pthread_mutex_lock(&f->lock);
    for (size_t at = 0; at < n; at += SSD_SLOT_BATCH) {
        size_t k = KVP_MIN((size_t)SSD_SLOT_BATCH, n - at);
        kvp_status_t st[SSD_SLOT_BATCH];
        for (size_t i = 0; i < k; i++) {
            st[i] = check_entry(f, &entries[at + i]);
            if (st[i] == KVP_OK)
                st[i] = data_sync;
        }
        if (data_sync == KVP_OK)
            record_batch(f, entries + at, k, st);
        for (size_t i = 0; i < k; i++) {
            if (statuses != NULL)
                statuses[at + i] = st[i];
            if (first == KVP_OK)
                first = st[i];
        }
    }
    pthread_mutex_unlock(&f->lock);
    return first;
}
