/*
 * ssd_file.h - an SSD segment's file: one preallocated file that holds the
 * segment's bytes and describes itself (see ssd_file.c for the format).
 *
 * The master allocates extents in the data area as in a DRAM segment (4 KiB
 * aligned); the owner writes each object's bytes there, then records an
 * entry (key, offset, size, CRC32C, the master's version of the object) in
 * the file's object table, so that after a restart (kill -9 included) the
 * same path comes back with its objects. A crash at any instant leaves either
 * the old or the new entry, never a torn one: an entry that does not pass its
 * own checksum is ignored.
 *
 * Thread-safe: the entry table is guarded by a mutex inside. Data I/O is the
 * caller's (ssd_io.h), on kvp_ssd_file_fd() at kvp_ssd_file_data_base().
 */
#ifndef KVP_CLIENT_SSD_SSD_FILE_H
#define KVP_CLIENT_SSD_SSD_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/ssd/ssd_io.h"
#include "common/status.h"

/* Longest key an SSD entry holds (an entry is one KVP_SSD_BLOCK). */
#define KVP_SSD_KEY_MAX 4000u

typedef struct kvp_ssd_entry {
    uint64_t version; /* the master's version of the object (never 0) */
    uint64_t offset;  /* extent offset in the segment, a multiple of KVP_SSD_BLOCK */
    uint64_t size;    /* object bytes (>= 1) */
    uint32_t crc32c;  /* CRC32C of the object's bytes */
    uint16_t key_len; /* 1..KVP_SSD_KEY_MAX */
    const char *key;  /* not NUL-terminated */
} kvp_ssd_entry_t;

typedef struct kvp_ssd_file kvp_ssd_file_t;

typedef struct kvp_ssd_open_params {
    const char *path;
    uint64_t size;        /* segment bytes (the data area), rounded down to KVP_SSD_BLOCK */
    uint32_t max_entries; /* object table slots; 0: size / 64 KiB, at least 1024 */
    bool buffered_io;     /* accept a filesystem without O_DIRECT (then page-cache I/O) */
    const char *what;     /* the file, in errors; NULL: "SSD segment file" */
} kvp_ssd_open_params_t;

/*
 * Open `p->path`, creating and preallocating (fallocate) it when it does not
 * exist (mode 0600, whatever the umask), and lock it (flock, exclusive,
 * non-blocking) for this process's lifetime. An existing file is recovered:
 * every valid entry comes back; of entries whose extents overlap only the
 * highest version is kept (the others are forgotten). Errors, with the
 * reason in why[why_len]:
 *   KVP_ERR_IN_USE       another live process holds the file;
 *   KVP_ERR_DENIED       an existing file another user owns, or that its group
 *                        or others may read or write (common/private_path.h:
 *                        the fix is said; never touched);
 *   KVP_ERR_INVALID_ARG  size too small, an existing file of another size or
 *                        table size, or not a kvpool SSD file (never
 *                        overwritten);
 *   KVP_ERR_UNSUPPORTED  the filesystem refuses O_DIRECT (and !buffered_io);
 *   KVP_ERR_NO_SPACE / KVP_ERR_IO / KVP_ERR_SYSTEM  creating or reading failed.
 */
kvp_status_t kvp_ssd_file_open(const kvp_ssd_open_params_t *p, kvp_ssd_file_t **f_p, char *why,
                               size_t why_len);
void kvp_ssd_file_close(kvp_ssd_file_t *f);
/* Read the header of a file another process owns (a DFS shard: fd opened by the caller,
 * neither locked nor recovered): the file offset of segment byte 0 and the segment's
 * bytes. KVP_ERR_INVALID_ARG: no valid header, or the file is shorter than it says. */
kvp_status_t kvp_ssd_file_peek(int fd, uint64_t *data_base_p, uint64_t *data_size_p);

int kvp_ssd_file_fd(const kvp_ssd_file_t *f);             /* O_DIRECT unless buffered */
uint64_t kvp_ssd_file_data_base(const kvp_ssd_file_t *f); /* file offset of segment byte 0 */
uint64_t kvp_ssd_file_size(const kvp_ssd_file_t *f);      /* segment bytes */
bool kvp_ssd_file_direct(const kvp_ssd_file_t *f);        /* O_DIRECT in use */
const char *kvp_ssd_file_path(const kvp_ssd_file_t *f);
uint32_t kvp_ssd_file_max_entries(const kvp_ssd_file_t *f);
/* The I/O counters of this file (ssd_io.h): rings doing its I/O count there
 * (kvp_ssd_io_set_stats). Valid until close. */
struct kvp_ssd_io_stats;
struct kvp_ssd_io_stats *kvp_ssd_file_io_stats(kvp_ssd_file_t *f);

/* Live entries. */
size_t kvp_ssd_file_count(kvp_ssd_file_t *f);
/* Call cb for every live entry (under the table lock: cb must not call back in). */
void kvp_ssd_file_foreach(kvp_ssd_file_t *f, void (*cb)(const kvp_ssd_entry_t *e, void *arg),
                          void *arg);

/*
 * Record n entries whose bytes are already written at their extents: first
 * the data is made durable (fdatasync), then each entry goes to a free slot
 * of the object table, then the slots are made durable; then any older
 * entry whose extent overlaps a new one is forgotten. statuses[i] (may be
 * NULL): KVP_OK, KVP_ERR_INVALID_ARG (bad extent or key), KVP_ERR_NO_SPACE
 * (no free slot), KVP_ERR_IO. Returns KVP_OK when every entry is recorded,
 * else the first failure.
 */
kvp_status_t kvp_ssd_file_record(kvp_ssd_file_t *f, const kvp_ssd_entry_t *entries, size_t n,
                                 kvp_status_t *statuses);

/*
 * Forget the entry whose extent starts at `offset` when its version is
 * `version` (0: whatever version): its slot is cleared on the file (written,
 * not synced: a crash may bring it back, which the version check of the
 * master and the CRC of the read make harmless). KVP_ERR_NOT_FOUND: no
 * such entry.
 */
kvp_status_t kvp_ssd_file_forget(kvp_ssd_file_t *f, uint64_t offset, uint64_t version);

/* The version of the live entry at `offset` (0: none). Thread: any. */
uint64_t kvp_ssd_file_version_at(kvp_ssd_file_t *f, uint64_t offset);
/* The same for n offsets under one lock (a data request's entries): versions[i]. */
void kvp_ssd_file_versions_at(kvp_ssd_file_t *f, const uint64_t *offsets, uint64_t *versions,
                              size_t n);

/* Copy the live entry at `offset` (key into key_buf[KVP_SSD_KEY_MAX]); false: none. */
bool kvp_ssd_file_lookup(kvp_ssd_file_t *f, uint64_t offset, kvp_ssd_entry_t *e, char *key_buf);

#endif
