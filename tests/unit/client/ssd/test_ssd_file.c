/*
 * test_ssd_file.c - unit tests for client/ssd/ssd_file.c (the SSD segment
 * file: header, object table, recovery) and client/ssd/ssd_io.c (io_uring).
 *
 * Real files on the real disk, in a directory made with mkdtemp under the
 * current directory (meson runs tests in the build directory) and removed at
 * the end; only the O_DIRECT-refusal test uses /dev/shm (tmpfs).
 *
 * Checked: create then reopen brings every recorded entry back exactly;
 * forget survives a reopen; a new version over an old extent leaves only
 * the new one, also when a lost forget leaves both on the file; a garbage
 * slot is ignored and the others survive; a second open (this process or a
 * forked child) is KVP_ERR_IN_USE; another size or table size, and a file
 * that is not ours, are KVP_ERR_INVALID_ARG with the file untouched; tmpfs
 * is KVP_ERR_UNSUPPORTED unless buffered I/O is allowed; a full table is
 * KVP_ERR_NO_SPACE; bad entries are KVP_ERR_INVALID_ARG; the second header
 * copy opens a file whose first is damaged; records of more entries than one
 * slot batch; io_uring reads and writes of multi-chunk lengths byte-exact;
 * a new file is mode 0600 whatever the umask (0 or 0277), and an existing
 * one (formatted or empty) that its group or others may read or write, or
 * (as root) another user's, is KVP_ERR_DENIED with the path and the fix in
 * the reason, untouched, and opens once chmod 600.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/ssd/ssd_file.h"
#include "client/ssd/ssd_io.h"
#include "common/crc32c.h"
#include "common/log.h"

#define MIB (1024ull * 1024)
#define TABLE_OFF 8192ull

static char g_dir[PATH_MAX];

static const char *path_of(const char *name)
{
    static char buf[PATH_MAX + 64];
    snprintf(buf, sizeof(buf), "%s/%s", g_dir, name);
    return buf;
}

static kvp_ssd_open_params_t params(const char *path, uint64_t size, uint32_t max_entries)
{
    return (kvp_ssd_open_params_t){.path = path, .size = size, .max_entries = max_entries};
}

static kvp_ssd_file_t *open_ok(const char *path, uint64_t size, uint32_t max_entries)
{
    kvp_ssd_open_params_t p = params(path, size, max_entries);
    kvp_ssd_file_t *f = NULL;
    char why[512];
    kvp_status_t st = kvp_ssd_file_open(&p, &f, why, sizeof(why));
    if (st != KVP_OK)
        fail_msg("open %s: %s: %s", path, kvp_strerror(st), why);
    return f;
}

/* Entries copied out by foreach. */
typedef struct got {
    size_t n;
    kvp_ssd_entry_t e[256];
    char keys[256][KVP_SSD_KEY_MAX];
} got_t;

static void collect(const kvp_ssd_entry_t *e, void *arg)
{
    got_t *g = arg;
    assert_true(g->n < 256);
    g->e[g->n] = *e;
    memcpy(g->keys[g->n], e->key, e->key_len);
    g->e[g->n].key = g->keys[g->n];
    g->n++;
}

static got_t *collect_all(kvp_ssd_file_t *f)
{
    got_t *g = calloc(1, sizeof(*g));
    assert_non_null(g);
    kvp_ssd_file_foreach(f, collect, g);
    assert_int_equal(g->n, kvp_ssd_file_count(f));
    return g;
}

static const kvp_ssd_entry_t *find(const got_t *g, uint64_t offset)
{
    for (size_t i = 0; i < g->n; i++)
        if (g->e[i].offset == offset)
            return &g->e[i];
    return NULL;
}

static void assert_entry_equal(const kvp_ssd_entry_t *a, const kvp_ssd_entry_t *b)
{
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->version, b->version);
    assert_int_equal(a->offset, b->offset);
    assert_int_equal(a->size, b->size);
    assert_int_equal(a->crc32c, b->crc32c);
    assert_int_equal(a->key_len, b->key_len);
    assert_memory_equal(a->key, b->key, a->key_len);
}

static kvp_ssd_entry_t entry(const char *key, uint64_t version, uint64_t offset, uint64_t size)
{
    return (kvp_ssd_entry_t){.version = version,
                             .offset = offset,
                             .size = size,
                             .crc32c = (uint32_t)(version * 2654435761u ^ offset),
                             .key_len = (uint16_t)strlen(key),
                             .key = key};
}

/* CRC32C of a whole file, read with plain buffered reads. */
static uint32_t file_crc(const char *path, off_t *size_p)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    static char buf[1 << 16];
    uint32_t crc = 0;
    off_t size = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        crc = kvp_crc32c(crc, buf, (size_t)n);
        size += n;
    }
    assert_true(n == 0);
    close(fd);
    *size_p = size;
    return crc;
}

static void pwrite_behind(const char *path, const void *buf, size_t len, off_t off)
{
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, buf, len, off), (ssize_t)len);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

static void test_create_reopen_recovers(void **state)
{
    (void)state;
    const char *path = path_of("recover");
    kvp_ssd_file_t *f = open_ok(path, 16 * MIB + 100, 64);
    assert_true(kvp_ssd_file_direct(f));
    assert_int_equal(kvp_ssd_file_size(f), 16 * MIB); /* rounded down to a block */
    assert_int_equal(kvp_ssd_file_max_entries(f), 64);
    assert_int_equal(kvp_ssd_file_data_base(f) % 4096, 0);
    assert_true(kvp_ssd_file_data_base(f) >= TABLE_OFF + 64 * 4096);
    assert_string_equal(kvp_ssd_file_path(f), path);
    assert_int_equal(kvp_ssd_file_count(f), 0);

    static char longkey[KVP_SSD_KEY_MAX + 1];
    memset(longkey, 'k', KVP_SSD_KEY_MAX);
    char keys[10][32];
    kvp_ssd_entry_t in[11];
    for (int i = 0; i < 10; i++) {
        snprintf(keys[i], sizeof(keys[i]), "obj/%d/%s", i, i % 2 ? "odd" : "even-key");
        in[i] = entry(keys[i], 1000 + (uint64_t)i * 7, (uint64_t)i * 65536, 1 + (uint64_t)i * 5000);
    }
    in[10] = entry(longkey, UINT64_MAX, 16 * MIB - 4096, 4096);
    kvp_status_t st[11];
    assert_int_equal(kvp_ssd_file_record(f, in, 11, st), KVP_OK);
    for (int i = 0; i < 11; i++)
        assert_int_equal(st[i], KVP_OK);
    assert_int_equal(kvp_ssd_file_count(f), 11);

    kvp_ssd_entry_t e;
    char kb[KVP_SSD_KEY_MAX];
    assert_true(kvp_ssd_file_lookup(f, 3 * 65536, &e, kb));
    assert_entry_equal(&e, &in[3]);
    assert_false(kvp_ssd_file_lookup(f, 3 * 65536 + 4096, &e, kb));
    kvp_ssd_file_close(f);

    f = open_ok(path, 16 * MIB + 100, 64);
    got_t *g = collect_all(f);
    assert_int_equal(g->n, 11);
    for (int i = 0; i < 11; i++)
        assert_entry_equal(find(g, in[i].offset), &in[i]);
    for (size_t i = 1; i < g->n; i++) /* foreach walks in offset order */
        assert_true(g->e[i - 1].offset < g->e[i].offset);
    assert_true(kvp_ssd_file_lookup(f, in[10].offset, &e, kb));
    assert_entry_equal(&e, &in[10]);
    free(g);
    kvp_ssd_file_close(f);
}

static void test_forget_survives_reopen(void **state)
{
    (void)state;
    const char *path = path_of("forget");
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 0);
    assert_int_equal(kvp_ssd_file_max_entries(f), 1024); /* default: at least 1024 */
    kvp_ssd_entry_t in[3] = {entry("a", 5, 0, 10), entry("b", 6, 4096, 4096),
                             entry("c", 7, 8192, 100)};
    assert_int_equal(kvp_ssd_file_record(f, in, 3, NULL), KVP_OK);
    assert_int_equal(kvp_ssd_file_forget(f, 4096, 5), KVP_ERR_NOT_FOUND); /* wrong version */
    assert_int_equal(kvp_ssd_file_forget(f, 12288, 0), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_ssd_file_forget(f, 4096, 6), KVP_OK);
    assert_int_equal(kvp_ssd_file_forget(f, 0, 0), KVP_OK);
    assert_int_equal(kvp_ssd_file_forget(f, 0, 0), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_ssd_file_count(f), 1);
    kvp_ssd_file_close(f);

    f = open_ok(path, 4 * MIB, 0);
    got_t *g = collect_all(f);
    assert_int_equal(g->n, 1);
    assert_entry_equal(&g->e[0], &in[2]);
    free(g);
    /* the freed slots are used again */
    assert_int_equal(kvp_ssd_file_record(f, in, 2, NULL), KVP_OK);
    assert_int_equal(kvp_ssd_file_count(f), 3);
    kvp_ssd_file_close(f);
}

static void test_new_version_over_old_extent(void **state)
{
    (void)state;
    const char *path = path_of("overlap");
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 32);
    kvp_ssd_entry_t old[3] = {entry("old-a", 10, 0, 3 * 4096), entry("old-b", 11, 3 * 4096, 4096),
                              entry("keep", 12, 8 * 4096, 4096)};
    assert_int_equal(kvp_ssd_file_record(f, old, 3, NULL), KVP_OK);
    /* one new extent over the tail of old-a and all of old-b */
    kvp_ssd_entry_t nw = entry("new", 20, 2 * 4096, 2 * 4096);
    assert_int_equal(kvp_ssd_file_record(f, &nw, 1, NULL), KVP_OK);
    assert_int_equal(kvp_ssd_file_count(f), 2);
    kvp_ssd_file_close(f);

    f = open_ok(path, 4 * MIB, 32);
    got_t *g = collect_all(f);
    assert_int_equal(g->n, 2);
    assert_entry_equal(find(g, 2 * 4096), &nw);
    assert_entry_equal(find(g, 8 * 4096), &old[2]);
    free(g);
    kvp_ssd_file_close(f);
}

/* A forget lost in a crash: both the old and the new entry are on the file. */
static void test_recovery_keeps_highest_version(void **state)
{
    (void)state;
    const char *path = path_of("lostforget");
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 32);
    kvp_ssd_entry_t a = entry("a", 1, 0, 2 * 4096);  /* slot 0 */
    kvp_ssd_entry_t c = entry("c", 3, 4096, 4096);   /* slot 1 */
    kvp_ssd_entry_t d = entry("d", 2, 2 * 4096, 10); /* slot 2: touches nobody */
    assert_int_equal(kvp_ssd_file_record(f, &a, 1, NULL), KVP_OK);
    static char slot0[4096];
    int fd = open(path, O_RDONLY);
    assert_int_equal(pread(fd, slot0, 4096, TABLE_OFF), 4096);
    close(fd);
    kvp_ssd_entry_t cd[2] = {c, d}; /* one call: slots 1 and 2 taken before a's is freed */
    assert_int_equal(kvp_ssd_file_record(f, cd, 2, NULL), KVP_OK);
    assert_int_equal(kvp_ssd_file_count(f), 2); /* a was forgotten */
    kvp_ssd_file_close(f);
    pwrite_behind(path, slot0, 4096, TABLE_OFF); /* a is back, as after a crash */

    f = open_ok(path, 4 * MIB, 32);
    got_t *g = collect_all(f);
    assert_int_equal(g->n, 2);
    assert_entry_equal(find(g, 4096), &c);
    assert_entry_equal(find(g, 2 * 4096), &d);
    free(g);
    kvp_ssd_file_close(f);
    /* the loser's slot was cleared on the file */
    fd = open(path, O_RDONLY);
    static char now[4096], zero[4096];
    assert_int_equal(pread(fd, now, 4096, TABLE_OFF), 4096);
    close(fd);
    assert_memory_equal(now, zero, 4096);
}

static void test_garbage_slot_ignored(void **state)
{
    (void)state;
    const char *path = path_of("garbage");
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 16);
    kvp_ssd_entry_t in[3] = {entry("x", 1, 0, 5), entry("y", 2, 4096, 5), entry("z", 3, 8192, 5)};
    assert_int_equal(kvp_ssd_file_record(f, in, 3, NULL), KVP_OK);
    kvp_ssd_file_close(f);
    /* slot 1 (y) overwritten with garbage; slot 2 (z) keeps its bytes but one key byte flips */
    static unsigned char junk[4096];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (unsigned char)(i * 131 + 7);
    pwrite_behind(path, junk, sizeof(junk), TABLE_OFF + 4096);
    pwrite_behind(path, "Z", 1, TABLE_OFF + 2 * 4096 + 40);

    f = open_ok(path, 4 * MIB, 16);
    got_t *g = collect_all(f);
    assert_int_equal(g->n, 1);
    assert_entry_equal(find(g, 0), &in[0]);
    free(g);
    /* the damaged slots are free again: 15 more entries fit */
    kvp_ssd_entry_t more[15];
    char keys[15][16];
    for (int i = 0; i < 15; i++) {
        snprintf(keys[i], sizeof(keys[i]), "m%d", i);
        more[i] = entry(keys[i], 9, (uint64_t)(i + 1) * 4096, 1);
    }
    assert_int_equal(kvp_ssd_file_record(f, more, 15, NULL), KVP_OK);
    assert_int_equal(kvp_ssd_file_count(f), 16);
    kvp_ssd_file_close(f);
}

static void test_in_use(void **state)
{
    (void)state;
    const char *path = path_of("inuse");
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 16);
    kvp_ssd_open_params_t p = params(path, 4 * MIB, 16);
    kvp_ssd_file_t *g = NULL;
    char why[512];
    assert_int_equal(kvp_ssd_file_open(&p, &g, why, sizeof(why)), KVP_ERR_IN_USE);
    assert_null(g);
    assert_non_null(strstr(why, "mounted by another live process"));
    assert_non_null(strstr(why, path));

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the child inherits f's fd, but flock is per open file: a new open conflicts */
        kvp_ssd_file_t *h = NULL;
        _exit(kvp_ssd_file_open(&p, &h, why, sizeof(why)) == KVP_ERR_IN_USE ? 0 : 1);
    }
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);

    kvp_ssd_file_close(f); /* the lock goes with it */
    f = open_ok(path, 4 * MIB, 16);
    kvp_ssd_file_close(f);
}

static void test_other_size_invalid(void **state)
{
    (void)state;
    const char *path = path_of("othersize");
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 16);
    kvp_ssd_entry_t e = entry("k", 1, 0, 1);
    assert_int_equal(kvp_ssd_file_record(f, &e, 1, NULL), KVP_OK);
    kvp_ssd_file_close(f);
    off_t size0, size1;
    uint32_t crc0 = file_crc(path, &size0);

    char why[512];
    kvp_ssd_open_params_t p = params(path, 8 * MIB, 16);
    assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(why, "4194304"));
    assert_non_null(strstr(why, "8388608"));
    p = params(path, 4 * MIB, 32);
    assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(why, "16"));
    assert_non_null(strstr(why, "32"));
    assert_int_equal(file_crc(path, &size1), crc0);
    assert_int_equal(size1, size0);

    f = open_ok(path, 4 * MIB, 16);
    assert_int_equal(kvp_ssd_file_count(f), 1);
    kvp_ssd_file_close(f);
}

static void test_not_kvpool_file(void **state)
{
    (void)state;
    char why[512];
    kvp_ssd_file_t *f = NULL;
    size_t sizes[2] = {100, 3 * 1024 * 1024 + 5};
    for (int k = 0; k < 2; k++) {
        const char *path = path_of(k ? "notours-big" : "notours-small");
        char *buf = malloc(sizes[k]);
        assert_non_null(buf);
        for (size_t i = 0; i < sizes[k]; i++)
            buf[i] = (char)(i * 7 + 1);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, buf, sizes[k]), (ssize_t)sizes[k]);
        close(fd);
        off_t size0, size1;
        uint32_t crc0 = file_crc(path, &size0);
        kvp_ssd_open_params_t p = params(path, 4 * MIB, 16);
        assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_ERR_INVALID_ARG);
        assert_non_null(strstr(why, "not a kvpool SSD file"));
        assert_int_equal(file_crc(path, &size1), crc0);
        assert_int_equal(size1, size0);
        free(buf);
    }
}

static void test_empty_file_formatted(void **state)
{
    (void)state;
    const char *path = path_of("empty");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 16);
    kvp_ssd_entry_t e = entry("k", 1, 4096, 1);
    assert_int_equal(kvp_ssd_file_record(f, &e, 1, NULL), KVP_OK);
    kvp_ssd_file_close(f);
    f = open_ok(path, 4 * MIB, 16);
    assert_int_equal(kvp_ssd_file_count(f), 1);
    kvp_ssd_file_close(f);
}

static unsigned mode_of(const char *path)
{
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return (unsigned)(sb.st_mode & 07777);
}

/* The file's permissions are its objects': made 0600 whatever the umask, refused looser. */
static void test_modes(void **state)
{
    (void)state;
    const mode_t masks[2] = {0, 0277};
    for (int k = 0; k < 2; k++) {
        const char *path = path_of(k ? "mode-umask0277" : "mode-umask0");
        mode_t was = umask(masks[k]);
        kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 16);
        umask(was);
        assert_int_equal(mode_of(path), 0600);
        kvp_ssd_file_close(f);
    }

    /* a formatted file, then an empty one: refused as they are, then opened once narrowed */
    const char *path = path_of("mode-umask0");
    int efd = open(path_of("mode-empty"), O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(efd >= 0);
    close(efd);
    const char *paths[2] = {path, path_of("mode-empty")};
    const mode_t loose[3] = {0640, 0604, 0660};
    for (int k = 0; k < 2; k++)
        for (int m = 0; m < 3; m++) {
            assert_int_equal(chmod(paths[k], loose[m]), 0);
            off_t size0, size1;
            uint32_t crc0 = file_crc(paths[k], &size0);
            kvp_ssd_open_params_t p = params(paths[k], 4 * MIB, 16);
            kvp_ssd_file_t *f = NULL;
            char why[1024], fix[PATH_MAX + 16];
            assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_ERR_DENIED);
            assert_null(f);
            snprintf(fix, sizeof(fix), "(chmod 600 %s)", paths[k]);
            assert_non_null(strstr(why, "may be read or written by others"));
            assert_non_null(strstr(why, fix));
            assert_int_equal(file_crc(paths[k], &size1), crc0); /* untouched */
            assert_int_equal(size1, size0);
            assert_int_equal(mode_of(paths[k]), loose[m]);
        }
    for (int k = 0; k < 2; k++) {
        assert_int_equal(chmod(paths[k], 0600), 0);
        kvp_ssd_file_close(open_ok(paths[k], 4 * MIB, 16));
    }

    /* another user's file, mode 0600: refused too (only root can make one here) */
    if (geteuid() == 0) {
        assert_int_equal(chown(path, 65534, 65534), 0);
        kvp_ssd_open_params_t p = params(path, 4 * MIB, 16);
        kvp_ssd_file_t *f = NULL;
        char why[1024];
        assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_ERR_DENIED);
        assert_non_null(strstr(why, "owner uid 65534"));
        assert_non_null(strstr(why, "chown 0 "));
        assert_int_equal(chown(path, 0, 0), 0);
        kvp_ssd_file_close(open_ok(path, 4 * MIB, 16));
    }
}

static void test_tmpfs_unsupported(void **state)
{
    (void)state;
    char dir[] = "/dev/shm/kvp-ssd-test-XXXXXX";
    if (mkdtemp(dir) == NULL)
        skip(); /* no /dev/shm here */
    char path[sizeof(dir) + 16];
    snprintf(path, sizeof(path), "%s/seg", dir);
    kvp_ssd_open_params_t p = params(path, 4 * MIB, 16);
    kvp_ssd_file_t *f = NULL;
    char why[512];
    assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_ERR_UNSUPPORTED);
    assert_null(f);
    assert_non_null(strstr(why, "O_DIRECT"));
    assert_int_equal(access(path, F_OK), -1); /* the file it created is gone again */

    p.buffered_io = true;
    assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_OK);
    assert_false(kvp_ssd_file_direct(f));
    kvp_ssd_entry_t e = entry("k", 1, 0, 1);
    assert_int_equal(kvp_ssd_file_record(f, &e, 1, NULL), KVP_OK);
    kvp_ssd_file_close(f);
    assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_OK);
    assert_int_equal(kvp_ssd_file_count(f), 1);
    kvp_ssd_file_close(f);
    unlink(path);
    rmdir(dir);
}

static void test_table_full(void **state)
{
    (void)state;
    const char *path = path_of("full");
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 4);
    kvp_ssd_entry_t in[5];
    char keys[5][8];
    for (int i = 0; i < 5; i++) {
        snprintf(keys[i], sizeof(keys[i]), "f%d", i);
        in[i] = entry(keys[i], 1, (uint64_t)i * 4096, 1);
    }
    kvp_status_t st[5];
    assert_int_equal(kvp_ssd_file_record(f, in, 5, st), KVP_ERR_NO_SPACE);
    for (int i = 0; i < 4; i++)
        assert_int_equal(st[i], KVP_OK);
    assert_int_equal(st[4], KVP_ERR_NO_SPACE);
    assert_int_equal(kvp_ssd_file_count(f), 4);
    /* a new version of a recorded extent needs a free slot too (never in place) */
    kvp_ssd_entry_t again = entry("f0", 2, 0, 1);
    assert_int_equal(kvp_ssd_file_record(f, &again, 1, NULL), KVP_ERR_NO_SPACE);
    assert_int_equal(kvp_ssd_file_forget(f, 0, 0), KVP_OK);
    assert_int_equal(kvp_ssd_file_record(f, &in[4], 1, NULL), KVP_OK);
    kvp_ssd_file_close(f);
}

static void test_bad_entries(void **state)
{
    (void)state;
    const char *path = path_of("bad");
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 16);
    static char longkey[KVP_SSD_KEY_MAX + 1];
    memset(longkey, 'q', sizeof(longkey));
    kvp_ssd_entry_t in[7] = {
        entry("ok", 1, 0, 1),
        {.version = 1, .offset = 4096, .size = 1, .key_len = KVP_SSD_KEY_MAX + 1, .key = longkey},
        entry("unaligned", 1, 100, 1),
        entry("v0", 0, 8192, 1),
        entry("beyond", 1, 4 * MIB - 4096, 4097),
        entry("size0", 1, 8192, 0),
        {.version = 1, .offset = 8192, .size = 1, .key_len = 0, .key = ""},
    };
    kvp_status_t st[7];
    assert_int_equal(kvp_ssd_file_record(f, in, 7, st), KVP_ERR_INVALID_ARG);
    assert_int_equal(st[0], KVP_OK);
    for (int i = 1; i < 7; i++)
        assert_int_equal(st[i], KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_ssd_file_count(f), 1);
    kvp_ssd_file_close(f);

    kvp_ssd_open_params_t p = params(path_of("tiny"), 4095, 16);
    char why[256];
    assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_ERR_INVALID_ARG);
}

static void test_second_header_copy(void **state)
{
    (void)state;
    const char *path = path_of("header");
    kvp_ssd_file_t *f = open_ok(path, 4 * MIB, 16);
    kvp_ssd_entry_t e = entry("h", 4, 4096, 77);
    assert_int_equal(kvp_ssd_file_record(f, &e, 1, NULL), KVP_OK);
    kvp_ssd_file_close(f);
    pwrite_behind(path, "garbage!", 8, 0);      /* the magic */
    pwrite_behind(path, "\x01\x02\x03", 3, 20); /* the data size */
    f = open_ok(path, 4 * MIB, 16);
    got_t *g = collect_all(f);
    assert_int_equal(g->n, 1);
    assert_entry_equal(&g->e[0], &e);
    free(g);
    kvp_ssd_file_close(f);
    /* both copies gone: not ours any more */
    pwrite_behind(path, "garbage!", 8, 4096);
    kvp_ssd_open_params_t p = params(path, 4 * MIB, 16);
    char why[512];
    assert_int_equal(kvp_ssd_file_open(&p, &f, why, sizeof(why)), KVP_ERR_INVALID_ARG);
}

/* More entries than one slot batch (64), over several record calls and reopens. */
static void test_many_entries(void **state)
{
    (void)state;
    const char *path = path_of("many");
    enum { N = 200 };
    kvp_ssd_file_t *f = open_ok(path, 8 * MIB, 256);
    static kvp_ssd_entry_t in[N];
    static char keys[N][24];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof(keys[i]), "many-%05d", i);
        in[i] = entry(keys[i], 100 + (uint64_t)i, (uint64_t)i * 8192, 8192);
    }
    static kvp_status_t st[N];
    assert_int_equal(kvp_ssd_file_record(f, in, N, st), KVP_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(st[i], KVP_OK);
    /* every other extent gets a new version */
    for (int i = 0; i < N; i += 2)
        in[i].version += 1000;
    for (int i = 0; i < N; i += 2)
        assert_int_equal(kvp_ssd_file_record(f, &in[i], 1, NULL), KVP_OK);
    assert_int_equal(kvp_ssd_file_count(f), N);
    kvp_ssd_file_close(f);

    f = open_ok(path, 8 * MIB, 256);
    got_t *g = collect_all(f);
    assert_int_equal(g->n, N);
    for (int i = 0; i < N; i++)
        assert_entry_equal(find(g, in[i].offset), &in[i]);
    free(g);
    kvp_ssd_file_close(f);
}

static void test_io_rw_roundtrip(void **state)
{
    (void)state;
    const char *path = path_of("io");
    kvp_ssd_file_t *f = open_ok(path, 16 * MIB, 16);
    kvp_ssd_io_t *io = NULL;
    assert_int_equal(kvp_ssd_io_create(KVP_SSD_IO_DEPTH, &io), KVP_OK);
    size_t len = 3 * MIB + MIB / 2;
    uint8_t *w = kvp_ssd_buf_alloc(len);
    uint8_t *w2 = kvp_ssd_buf_alloc(5 * 4096);
    uint8_t *r = kvp_ssd_buf_alloc(len);
    uint8_t *r2 = kvp_ssd_buf_alloc(5 * 4096);
    assert_non_null(w);
    assert_non_null(r);
    assert_int_equal((uintptr_t)w % 4096, 0);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w[i] = (uint8_t)x;
    }
    memset(w2, 0xA5, 5 * 4096);
    int fd = kvp_ssd_file_fd(f);
    uint64_t base = kvp_ssd_file_data_base(f);
    kvp_ssd_iov_t ops[2] = {{.buf = w, .file_off = base + 4096, .len = len},
                            {.buf = w2, .file_off = base + 8 * MIB, .len = 5 * 4096}};
    assert_int_equal(kvp_ssd_io_rw(io, fd, true, ops, 2), KVP_OK);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_int_equal(ops[1].status, KVP_OK);
    assert_int_equal(kvp_ssd_io_datasync(io, fd), KVP_OK);
    kvp_ssd_iov_t rops[2] = {{.buf = r2, .file_off = base + 8 * MIB, .len = 5 * 4096},
                             {.buf = r, .file_off = base + 4096, .len = len}};
    assert_int_equal(kvp_ssd_io_rw(io, fd, false, rops, 2), KVP_OK);
    assert_memory_equal(r, w, len);
    assert_memory_equal(r2, w2, 5 * 4096);
    /* a read past the end of the file is a short transfer: KVP_ERR_IO */
    uint64_t end = base + kvp_ssd_file_size(f);
    kvp_ssd_iov_t past = {.buf = r, .file_off = end - 4096, .len = 2 * 4096};
    assert_int_equal(kvp_ssd_io_rw(io, fd, false, &past, 1), KVP_ERR_IO);
    assert_int_equal(past.status, KVP_ERR_IO);
    /* and the ring still works */
    assert_int_equal(kvp_ssd_io_rw(io, fd, false, rops, 2), KVP_OK);
    free(w);
    free(w2);
    free(r);
    free(r2);
    kvp_ssd_io_destroy(io);
    kvp_ssd_file_close(f);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(void)
{
    kvp_log_init_from_env(); /* KVPOOL_LOG_LEVEL=info shows the recoveries */
    snprintf(g_dir, sizeof(g_dir), "./ssd-file-test-XXXXXX");
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_reopen_recovers),
        cmocka_unit_test(test_forget_survives_reopen),
        cmocka_unit_test(test_new_version_over_old_extent),
        cmocka_unit_test(test_recovery_keeps_highest_version),
        cmocka_unit_test(test_garbage_slot_ignored),
        cmocka_unit_test(test_in_use),
        cmocka_unit_test(test_other_size_invalid),
        cmocka_unit_test(test_not_kvpool_file),
        cmocka_unit_test(test_empty_file_formatted),
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_tmpfs_unsupported),
        cmocka_unit_test(test_table_full),
        cmocka_unit_test(test_bad_entries),
        cmocka_unit_test(test_second_header_copy),
        cmocka_unit_test(test_many_entries),
        cmocka_unit_test(test_io_rw_roundtrip),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed;
}
