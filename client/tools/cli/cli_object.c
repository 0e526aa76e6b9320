/*
 * cli_object.c - the kvpool commands on objects by key: put, get, exist, rm KEY... and ls.
 *
 * Design: `put` checks the key, then loads FILE (a regular file is mapped, stdin and
 * other streams are read to their end) before it connects. `get` fetches the whole
 * object before it creates anything, then writes a temporary file beside FILE and
 * renames it over FILE: a failed get never leaves a partial FILE. Keys are sent in
 * batches of at most KVP_MAX_BATCH; a key the library left without an answer gets the
 * batch's status. `rm --regex` and `rm --all` are carried out by cli_admin.c.
 *
 * Thread: the command's (main) thread; the library and the progress reporter run their
 * own threads.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/tools/cli/cli.h"
#include "common/key.h"
#include "common/macros.h"

/* A get whose key is replaced by a larger object between size and read retries this often. */
#define KVP_CLI_GET_ATTEMPTS 3
/* "Long work" for KVP_CLI_PROGRESS_AUTO: objects of this many bytes, removes of this many
 * keys. */
#define KVP_CLI_PROGRESS_BYTES (32u << 20)
#define KVP_CLI_PROGRESS_KEYS 10000u
/* Keys per remove batch while progress is shown (so it moves). */
#define KVP_CLI_RM_STEP 1024u

/* An input object: either a read-only mapping of a file or a malloc'd buffer. */
typedef struct input {
    void *data;
    size_t len;
    bool mapped;
} input_t;

/* ---- put ---------------------------------------------------------------- */

/* Read fd to its end into a malloc'd buffer (pipes, ttys, /proc files). */
static int read_stream(int fd, const char *what, input_t *in)
{
    size_t cap = 1 << 20;
    size_t len = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return kvp_cli_fail(strerror(ENOMEM), "reading %s", what);
    for (;;) {
        if (len == cap) {
            char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                return kvp_cli_fail(strerror(ENOMEM), "reading %s", what);
            }
            buf = bigger;
            cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n == 0)
            break;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            return kvp_cli_fail(strerror(e), "cannot read %s", what);
        }
        len += (size_t)n;
    }
    in->data = buf;
    in->len = len;
    in->mapped = false;
    return KVP_CLI_OK;
}

/* Map the regular file `path` (open on fd, st_size > 0) into `in`. */
static int input_map(int fd, const char *path, const struct stat *st, input_t *in)
{
    if ((uint64_t)st->st_size > SIZE_MAX)
        return kvp_cli_fail(strerror(EFBIG), "cannot map '%s'", path);
    void *p = mmap(NULL, (size_t)st->st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
        return kvp_cli_fail(strerror(errno), "cannot map '%s'", path);
    madvise(p, (size_t)st->st_size, MADV_SEQUENTIAL);
    in->data = p;
    in->len = (size_t)st->st_size;
    in->mapped = true;
    return KVP_CLI_OK;
}

/* Load FILE ("-": stdin) into `in`: regular files are mapped, the rest read. */
static int input_load(const char *path, input_t *in)
{
    if (strcmp(path, "-") == 0)
        return read_stream(STDIN_FILENO, "stdin", in);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvp_cli_fail(strerror(errno), "cannot open '%s'", path);
    struct stat st;
    int rc;
    if (fstat(fd, &st) < 0) {
        rc = kvp_cli_fail(strerror(errno), "cannot stat '%s'", path);
    } else if (S_ISDIR(st.st_mode)) {
        rc = kvp_cli_fail(strerror(EISDIR), "cannot read '%s'", path);
    } else if (S_ISREG(st.st_mode) && st.st_size > 0) {
        rc = input_map(fd, path, &st, in);
    } else {
        /* Pipes, devices, and regular files that claim size 0 (/proc). */
        char what[PATH_MAX + 2];
        snprintf(what, sizeof(what), "'%s'", path);
        rc = read_stream(fd, what, in);
    }
    close(fd);
    return rc;
}

static void input_release(input_t *in)
{
    if (in->mapped)
        munmap(in->data, in->len);
    else
        free(in->data);
}

/* put's options into *config; -1, or the exit code when put must stop now. */
static int put_parse(const kvp_cli_command_t *cmd, int argc, char **argv, kvp_put_config_t *config)
{
    static const struct option opts[] = {
        {"replicas", required_argument, NULL, 'r'},
        {"prefer", required_argument, NULL, 'p'},
        {"upsert", no_argument, NULL, 'u'},
        {"medium", required_argument, NULL, 'm'},
        {"dfs", no_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    uint64_t v;
    int opt;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'd': /* a DFS replica besides the memory ones (dfs_replica_num 1) */
            config->dfs_replica_num = 1;
            break;
        case 'r':
            if (!kvp_cli_parse_uint(optarg, UINT32_MAX, &v) || v == 0)
                return kvp_cli_usage_error(cmd, "--replicas needs a count >= 1, got '%s'", optarg);
            config->replica_num = (uint32_t)v;
            break;
        case 'p':
            config->preferred_segment = optarg;
            break;
        case 'u':
            config->mode = KVP_PUT_UPSERT;
            break;
        case 'm':
            if (strcmp(optarg, "dram") != 0 && strcmp(optarg, "ssd") != 0)
                return kvp_cli_usage_error(cmd, "--medium needs dram or ssd, got '%s'", optarg);
            config->medium = optarg;
            break;
        default:
            return kvp_cli_option_other(cmd, opt, argc, argv);
        }
    }
    return -1;
}

int kvp_cli_put(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv)
{
    kvp_put_config_t config;
    kvp_put_config_init(&config);
    int rc = put_parse(cmd, argc, argv, &config);
    if (rc >= 0)
        return rc;
    if (argc - optind != 2)
        return kvp_cli_usage_error(cmd, "put needs KEY and FILE (or - for stdin)");
    const char *key = argv[optind];
    const char *path = argv[optind + 1];
    /* Before reading what may be gigabytes of stdin. */
    if (!kvp_key_valid(key, strlen(key)))
        return kvp_cli_fail(kvp_cli_why(KVP_ERR_BAD_KEY), "put %s", key);

    input_t in;
    rc = input_load(path, &in);
    if (rc != KVP_CLI_OK)
        return rc;
    if (in.len == 0) {
        input_release(&in);
        fprintf(stderr, "kvpool: put %s: %s is empty: refusing to store an empty object\n", key,
                strcmp(path, "-") == 0 ? "stdin" : path);
        return KVP_CLI_FAIL;
    }
    kvp_client_t *client;
    if (kvp_cli_client_open(cli, NULL, &client) != KVP_OK) {
        input_release(&in);
        return KVP_CLI_FAIL;
    }
    const void *buf = in.data;
    size_t len = in.len;
    kvp_status_t result = KVP_OK;
    uint32_t written = 0;
    /* one call moves the object: its progress is the elapsed time, then the whole */
    kvp_progress_t *prog = NULL;
    if (kvp_cli_progress_wanted(cli, len >= KVP_CLI_PROGRESS_BYTES))
        prog = kvp_cli_progress_start("put", key, 0, true, NULL);
    kvp_status_t status =
        kvp_batch_put_from_ex(client, &key, &buf, &len, 1, &config, &result, &written);
    if (status == KVP_OK) {
        kvp_progress_set_total(prog, len);
        kvp_progress_set(prog, len);
    }
    kvp_progress_end(prog, status == KVP_OK ? "done" : "failed");
    kvp_client_destroy(client);
    input_release(&in);
    if (status != KVP_OK)
        return kvp_cli_fail(kvp_cli_why(result != KVP_OK ? result : status), "put %s", key);
    if (written < config.replica_num)
        fprintf(stderr, "kvpool: put %s: stored with %u of %u replicas\n", key, written,
                config.replica_num);
    return KVP_CLI_OK;
}

/* ---- get ---------------------------------------------------------------- */

/* kvp_cli_write_all in steps, telling `p` how far it is (NULL: no progress). */
static bool write_all_progress(int fd, const void *buf, size_t len, kvp_progress_t *p)
{
    const size_t step = 8u << 20;
    for (size_t at = 0; at < len;) {
        size_t n = KVP_MIN(step, len - at);
        if (!kvp_cli_write_all(fd, (const char *)buf + at, n))
            return false;
        at += n;
        kvp_progress_set(p, at);
    }
    return true;
}

/*
 * Write buf to path so that path either keeps its old content or holds all of
 * buf: a temp file in the same directory, renamed over path. Non-regular
 * targets (/dev/null, fifos) are written in place, never replaced.
 */
static int output_write(const char *path, const void *buf, size_t len, kvp_progress_t *prog)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return kvp_cli_fail(strerror(EISDIR), "cannot write '%s'", path);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            return kvp_cli_fail(strerror(errno), "cannot open '%s'", path);
        bool ok = write_all_progress(fd, buf, len, prog);
        int e = errno;
        close(fd);
        return ok ? KVP_CLI_OK : kvp_cli_fail(strerror(e), "cannot write '%s'", path);
    }
    /* Replace what a symlink points to, not the link itself. */
    char *target = realpath(path, NULL);
    const char *dst = target != NULL ? target : path;
    const char *slash = strrchr(dst, '/');
    size_t dirlen = slash != NULL ? (size_t)(slash - dst) + 1 : 0;
    const char *base = dst + dirlen;
    size_t tlen = strlen(dst) + 32;
    char *tmp = malloc(tlen);
    if (tmp == NULL) {
        free(target);
        return kvp_cli_fail(strerror(ENOMEM), "cannot write '%s'", path);
    }
    snprintf(tmp, tlen, "%.*s.%s.kvpool-XXXXXX", (int)dirlen, dst, base);

    int rc = KVP_CLI_FAIL;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        kvp_cli_fail(strerror(errno), "cannot create a temporary file for '%s'", path);
        goto out_free;
    }
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) < 0 || !write_all_progress(fd, buf, len, prog)) {
        kvp_cli_fail(strerror(errno), "cannot write '%s'", tmp);
        goto out_unlink;
    }
    if (close(fd) < 0) {
        fd = -1;
        kvp_cli_fail(strerror(errno), "cannot write '%s'", tmp);
        goto out_unlink;
    }
    fd = -1;
    if (rename(tmp, dst) < 0) {
        kvp_cli_fail(strerror(errno), "cannot rename '%s' to '%s'", tmp, dst);
        goto out_unlink;
    }
    rc = KVP_CLI_OK;
    goto out_free;

out_unlink:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
out_free:
    free(tmp);
    free(target);
    return rc;
}

int kvp_cli_get(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv)
{
    int rc = kvp_cli_parse_no_options(cmd, argc, argv);
    if (rc >= 0)
        return rc;
    if (argc - optind < 1 || argc - optind > 2)
        return kvp_cli_usage_error(cmd, "get needs KEY and optionally FILE");
    const char *key = argv[optind];
    const char *path = argc - optind == 2 ? argv[optind + 1] : "-";

    kvp_client_t *client;
    if (kvp_cli_client_open(cli, NULL, &client) != KVP_OK)
        return KVP_CLI_FAIL;
    void *buf = NULL;
    int64_t got = KVP_ERR_INTERNAL;
    kvp_progress_t *prog = NULL;
    /* The key may be removed and re-put with another size between the calls. */
    for (int attempt = 0; attempt < KVP_CLI_GET_ATTEMPTS; attempt++) {
        int64_t size = kvp_get_size(client, key);
        if (size < 0) {
            got = size;
            break;
        }
        if (prog == NULL && kvp_cli_progress_wanted(cli, (uint64_t)size >= KVP_CLI_PROGRESS_BYTES))
            prog = kvp_cli_progress_start("get", key, 0, true, NULL);
        if ((uint64_t)size > SIZE_MAX || (buf = malloc((size_t)size)) == NULL) {
            kvp_progress_end(prog, "failed");
            kvp_client_destroy(client);
            fprintf(stderr, "kvpool: get %s: cannot allocate %" PRId64 " bytes\n", key, size);
            return KVP_CLI_FAIL;
        }
        got = kvp_get_into(client, key, buf, (size_t)size);
        if (got != KVP_ERR_BUFFER_TOO_SMALL)
            break;
        free(buf);
        buf = NULL;
    }
    kvp_client_destroy(client);
    if (got >= 0 && prog != NULL) {
        /* the transfer is one call; writing the file is shown as it goes */
        kvp_progress_set_total(prog, (uint64_t)got);
        kvp_progress_set(prog, (uint64_t)got);
        char what[PATH_MAX + 16];
        snprintf(what, sizeof(what), "write %s", strcmp(path, "-") == 0 ? "stdout" : path);
        kvp_progress_phase(prog, what, (uint64_t)got);
    }
    if (got < 0)
        rc = kvp_cli_fail(kvp_cli_why((kvp_status_t)got), "get %s", key);
    else if (strcmp(path, "-") == 0 && !write_all_progress(STDOUT_FILENO, buf, (size_t)got, prog))
        /* A reader that went away (| head) is not worth a message. */
        rc = errno == EPIPE ? KVP_CLI_FAIL
                            : kvp_cli_fail(strerror(errno), "get %s: writing stdout", key);
    else if (strcmp(path, "-") == 0)
        rc = KVP_CLI_OK;
    else
        rc = output_write(path, buf, (size_t)got, prog);
    kvp_progress_end(prog, got >= 0 && rc == KVP_CLI_OK ? "done" : "failed");
    free(buf);
    return rc;
}

/* ---- exist, rm ---------------------------------------------------------- */

int kvp_cli_exist(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv)
{
    int rc = kvp_cli_parse_no_options(cmd, argc, argv);
    if (rc >= 0)
        return rc;
    if (optind >= argc)
        return kvp_cli_usage_error(cmd, "%s needs at least one KEY", cmd->name);
    const char *const *keys = (const char *const *)argv + optind;
    size_t n = (size_t)(argc - optind);
    int *results = malloc(n * sizeof(*results));
    if (results == NULL)
        return kvp_cli_fail(strerror(ENOMEM), "exist");
    kvp_client_t *client;
    if (kvp_cli_client_open(cli, NULL, &client) != KVP_OK) {
        free(results);
        return KVP_CLI_USAGE; /* an error, not an answer: same code as test(1) */
    }
    for (size_t off = 0; off < n; off += KVP_MAX_BATCH) {
        size_t cnt = KVP_MIN(n - off, (size_t)KVP_MAX_BATCH);
        for (size_t i = 0; i < cnt; i++)
            results[off + i] = 2; /* not an answer: left unwritten by the library */
        kvp_status_t status = kvp_batch_is_exist(client, keys + off, cnt, results + off, NULL);
        for (size_t i = 0; i < cnt && status != KVP_OK; i++)
            if (results[off + i] == 2)
                results[off + i] = status;
    }
    kvp_client_destroy(client);
    bool all = true, error = false;
    for (size_t i = 0; i < n; i++) {
        if (results[i] == 1) {
            printf("%s\tyes\n", keys[i]);
        } else if (results[i] == 0) {
            printf("%s\tno\n", keys[i]);
            all = false;
        } else {
            printf("%s\terror: %s\n", keys[i], kvp_strerror((kvp_status_t)results[i]));
            error = true;
        }
    }
    free(results);
    if (fflush(stdout) != 0) {
        kvp_cli_fail(strerror(errno), "writing stdout");
        return KVP_CLI_USAGE;
    }
    return error ? KVP_CLI_USAGE : all ? KVP_CLI_OK : KVP_CLI_FAIL;
}

/* Remove the n keys, each failure on stderr as KEY<TAB>WHY; the exit code. */
static int rm_keys(const kvp_cli_t *cli, const char *const *keys, size_t n, bool force)
{
    kvp_status_t *results = malloc(n * sizeof(*results));
    if (results == NULL)
        return kvp_cli_fail(strerror(ENOMEM), "rm");
    kvp_client_t *client;
    if (kvp_cli_client_open(cli, NULL, &client) != KVP_OK) {
        free(results);
        return KVP_CLI_FAIL;
    }
    kvp_progress_t *prog = NULL;
    size_t step = KVP_MAX_BATCH;
    if (kvp_cli_progress_wanted(cli, n >= KVP_CLI_PROGRESS_KEYS)) {
        prog = kvp_progress_start("rm", n, false, "keys", KVP_PROGRESS_AUTO, 0);
        step = KVP_CLI_RM_STEP; /* smaller batches, so the progress moves */
    }
    for (size_t off = 0; off < n; off += step) {
        size_t cnt = KVP_MIN(n - off, step);
        kvp_progress_set(prog, off);
        for (size_t i = 0; i < cnt; i++)
            results[off + i] = (kvp_status_t)1; /* not a status: unwritten */
        kvp_status_t status = force ? kvp_batch_remove_force(client, keys + off, cnt, results + off)
                                    : kvp_batch_remove(client, keys + off, cnt, results + off);
        for (size_t i = 0; i < cnt; i++)
            if ((int)results[off + i] == 1)
                results[off + i] = status;
    }
    kvp_progress_set(prog, n);
    kvp_progress_end(prog, "done");
    kvp_client_destroy(client);
    int rc = KVP_CLI_OK;
    for (size_t i = 0; i < n; i++) {
        if (results[i] != KVP_OK) {
            fprintf(stderr, "%s\t%s\n", keys[i], kvp_strerror(results[i]));
            rc = KVP_CLI_FAIL;
        }
    }
    free(results);
    return rc;
}

int kvp_cli_rm(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv)
{
    static const struct option opts[] = {
        {"force", no_argument, NULL, 'f'},
        {"regex", required_argument, NULL, 'r'},
        {"all", no_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool force = false, all = false;
    const char *regex = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "+:fh", opts, NULL)) != -1) {
        if (opt == 'f')
            force = true;
        else if (opt == 'r')
            regex = optarg;
        else if (opt == 'a')
            all = true;
        else
            return kvp_cli_option_other(cmd, opt, argc, argv);
    }
    if (regex != NULL || all) {
        if (optind < argc || (regex != NULL && all))
            return kvp_cli_usage_error(cmd, "rm takes KEYs, --regex RE or --all, not several");
        if (regex != NULL && regex[0] == '\0')
            return kvp_cli_usage_error(cmd,
                                       "--regex needs a non-empty pattern (--all removes all)");
        return kvp_cli_rm_matching(cli, regex, force);
    }
    if (optind >= argc)
        return kvp_cli_usage_error(cmd, "%s needs at least one KEY", cmd->name);
    return rm_keys(cli, (const char *const *)argv + optind, (size_t)(argc - optind), force);
}

/* ---- ls ----------------------------------------------------------------- */

/* Where key k's replicas are, from their segments in ps (NULL: not known): "dram", "ssd",
 * "dfs", "dram+ssd", "dram+dfs", "ssd+dfs", "dram+ssd+dfs" or "-". */
static const char *ls_medium(const kvp_key_info_t *k, const kvp_pool_stat_t *ps)
{
    static const char *const names[8] = {"-",   "dram",     "ssd",     "dram+ssd",
                                         "dfs", "dram+dfs", "ssd+dfs", "dram+ssd+dfs"};
    unsigned on = 0;
    for (uint32_t r = 0; r < k->n_replicas && r < 8; r++)
        for (size_t g = 0; ps != NULL && g < ps->n_segments; g++)
            if (ps->segments[g].id == k->segment_ids[r])
                on |= strcmp(ps->segments[g].medium, "ssd") == 0   ? 2u
                      : strcmp(ps->segments[g].medium, "dfs") == 0 ? 4u
                                                                   : 1u;
    return names[on];
}

/* The n keys on stdout: a table under a header line, or (json) an array. */
static void ls_print(const kvp_key_info_t *keys, size_t n, const kvp_pool_stat_t *ps, bool json)
{
    char a[32];
    /* with an ACL on the master each key has its tenant (an admin sees every tenant's) */
    bool tenants = false;
    for (size_t i = 0; i < n && !tenants; i++)
        tenants = kvp_key_info_tenant(&keys[i])[0] != '\0';
    if (json)
        fputs("[", stdout);
    else if (n > 0)
        printf("%-10s  %8s  %-8s  %-5s  %8s  %s%s\n", "SIZE", "REPLICAS", "MEDIUM", "PIN", "LEASE",
               tenants ? "TENANT/" : "", "KEY");
    for (size_t i = 0; i < n; i++) {
        const kvp_key_info_t *k = &keys[i];
        const char *pin = k->pin == KVP_PIN_HARD ? "hard" : k->pin == KVP_PIN_SOFT ? "soft" : "-";
        const char *medium = ls_medium(k, ps);
        if (json) {
            printf("%s{\"key\":", i > 0 ? "," : "");
            kvp_cli_json_string(k->key, strlen(k->key));
            if (tenants) {
                printf(",\"tenant\":");
                kvp_cli_json_string(kvp_key_info_tenant(k), strlen(kvp_key_info_tenant(k)));
            }
            printf(",\"size\":%" PRIu64 ",\"replicas\":%u,\"medium\":\"%s\",\"complete\":%s,"
                   "\"lease_ms\":%u,\"pin\":\"%s\"}",
                   k->size, k->n_replicas, medium, k->complete ? "true" : "false", k->lease_ms,
                   pin);
        } else {
            char lease[32] = "-";
            if (!k->complete)
                snprintf(lease, sizeof(lease), "writing");
            else if (k->lease_ms > 0)
                snprintf(lease, sizeof(lease), "%.1fs", k->lease_ms / 1000.0);
            printf("%-10s  %8u  %-8s  %-5s  %8s  %s%s%s\n",
                   kvp_progress_size(k->size, a, sizeof(a)), k->n_replicas, medium, pin, lease,
                   tenants ? kvp_key_info_tenant(k) : "", tenants ? "/" : "", k->key);
        }
    }
    if (json)
        fputs("]\n", stdout);
}

int kvp_cli_ls(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv)
{
    static const struct option opts[] = {
        {"limit", required_argument, NULL, 'l'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    uint64_t limit = 1000;
    bool json = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        if (opt == 'l') {
            if (!kvp_cli_parse_uint(optarg, 10000000, &limit) || limit == 0)
                return kvp_cli_usage_error(cmd, "--limit needs a count 1..10000000, got '%s'",
                                           optarg);
        } else if (opt == 'j') {
            json = true;
        } else {
            return kvp_cli_option_other(cmd, opt, argc, argv);
        }
    }
    if (argc - optind > 1)
        return kvp_cli_usage_error(cmd, "ls takes at most one PATTERN");
    const char *pattern = optind < argc ? argv[optind] : "";
    kvp_client_t *client;
    if (kvp_cli_client_open(cli, NULL, &client) != KVP_OK)
        return KVP_CLI_FAIL;
    kvp_key_info_t *keys = NULL;
    size_t n = 0;
    kvp_status_t st = kvp_list_keys(client, pattern, (size_t)limit + 1, &keys, &n);
    kvp_pool_stat_t *ps = NULL; /* each replica's medium, from its segment */
    if (st == KVP_OK && kvp_pool_stat(client, &ps) != KVP_OK)
        ps = NULL;
    kvp_client_destroy(client);
    if (st != KVP_OK)
        return kvp_cli_fail(kvp_cli_why(st), "ls %s", pattern);
    bool more = n > limit;
    if (more)
        n = (size_t)limit;
    ls_print(keys, n, ps, json);
    if (more)
        fprintf(stderr, "kvpool: ls: showing the first %" PRIu64 " keys; more match (--limit)\n",
                limit);
    kvp_key_list_free(keys, more ? n + 1 : n);
    if (ps != NULL)
        kvp_pool_stat_free(ps);
    if (fflush(stdout) != 0)
        return kvp_cli_fail(strerror(errno), "writing stdout");
    return KVP_CLI_OK;
}
