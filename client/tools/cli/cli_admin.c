/*
 * cli_admin.c - the kvpool commands on the pool as a whole: stat (capacity, usage and
 * segments, once or --watch), drain (ask a segment's owner to move its objects elsewhere
 * and unmount) and the bulk removes of rm (--regex RE, --all).
 *
 * Design: the master carries out a bulk remove as one request, so its progress is only
 * the elapsed time. drain asks the owner through the master, then polls the pool's
 * statistics until the segment is gone or --wait runs out; its progress counts the
 * replicas the segment no longer holds. stat --watch blocks SIGINT and SIGTERM before the
 * client's threads exist and takes them in sigtimedwait() between draws, as serve does.
 *
 * Thread: the command's (main) thread; the library and the progress reporter run their
 * own threads.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/tools/cli/cli.h"
#include "common/clock.h"
#include "common/macros.h"

/* ---- rm --regex, rm --all ----------------------------------------------- */

int kvp_cli_rm_matching(const kvp_cli_t *cli, const char *regex, bool force)
{
    bool all = regex == NULL;
    kvp_client_t *client;
    if (kvp_cli_client_open(cli, NULL, &client) != KVP_OK)
        return KVP_CLI_FAIL;
    uint64_t removed = 0;
    /* one request the master carries out: only the elapsed time to show, on request */
    kvp_progress_t *prog = kvp_cli_progress_wanted(cli, false)
                               ? kvp_progress_start(all ? "rm --all" : "rm --regex", 0, false,
                                                    "objects", KVP_PROGRESS_AUTO, 0)
                               : NULL;
    kvp_status_t st = all ? kvp_remove_all(client, force, &removed)
                          : kvp_remove_by_regex(client, regex, force, &removed);
    kvp_progress_set(prog, removed);
    kvp_progress_end(prog, st == KVP_OK ? "done" : "failed");
    kvp_client_destroy(client);
    if (st != KVP_OK)
        return kvp_cli_fail(kvp_cli_why(st), "rm %s%s", all ? "--all" : "--regex ",
                            all ? "" : regex);
    printf("removed %" PRIu64 " objects\n", removed);
    return KVP_CLI_OK;
}

/* ---- drain -------------------------------------------------------------- */

/* Whether segment `name` is in the pool now (*present_p) and, when it is, how many
 * objects it holds (*objects_p). */
static kvp_status_t drain_find(kvp_client_t *client, const char *name, bool *present_p,
                               uint64_t *objects_p)
{
    kvp_pool_stat_t *ps = NULL;
    kvp_status_t st = kvp_pool_stat(client, &ps);
    if (st != KVP_OK)
        return st;
    *present_p = false;
    for (size_t i = 0; i < ps->n_segments; i++)
        if (strcmp(ps->segments[i].name, name) == 0) {
            *present_p = true;
            *objects_p = ps->segments[i].objects;
        }
    kvp_pool_stat_free(ps);
    return KVP_OK;
}

/*
 * Watch segment `name`, whose drain was requested at t0, until it is gone (KVP_CLI_OK),
 * wait_s seconds passed (0: at once, KVP_CLI_OK; else KVP_CLI_FAIL) or the pool cannot be
 * asked (KVP_CLI_FAIL). first: the objects it held when the drain began (UINT64_MAX: not
 * known yet). Ends prog (transferred; NULL: none).
 */
static int drain_watch(kvp_client_t *client, const char *name, double wait_s, uint64_t t0,
                       uint64_t first, kvp_progress_t *prog)
{
    int rc = KVP_CLI_FAIL;
    uint64_t left = 0;
    for (;;) {
        bool present;
        kvp_status_t st = drain_find(client, name, &present, &left);
        if (st != KVP_OK) {
            kvp_progress_end(prog, "failed");
            prog = NULL;
            kvp_cli_fail(kvp_cli_why(st), "drain %s: stat", name);
            break;
        }
        if (present && first == UINT64_MAX) {
            first = left; /* what it held when the drain began */
            kvp_progress_set_total(prog, first);
        }
        if (first != UINT64_MAX)
            kvp_progress_set(prog, present ? first - KVP_MIN(left, first) : first);
        double dt = (double)(kvp_now_ms() - t0) / 1000.0;
        if (!present) {
            kvp_progress_end(prog, "unmounted");
            prog = NULL;
            printf("segment %s drained and unmounted in %.1f s\n", name, dt);
            rc = KVP_CLI_OK;
            break;
        }
        if (dt >= wait_s && wait_s == 0) {
            printf("drain of %s requested\n", name);
            rc = KVP_CLI_OK;
            break;
        }
        if (dt >= wait_s) {
            kvp_progress_end(prog, "still mounted");
            prog = NULL;
            fprintf(stderr,
                    "kvpool: drain %s: still mounted after %.1f s (%" PRIu64
                    " replicas left); the owner keeps draining\n",
                    name, dt, left);
            break;
        }
        usleep(100 * 1000);
    }
    kvp_progress_end(prog, rc == KVP_CLI_OK ? "requested" : "still mounted");
    return rc;
}

int kvp_cli_drain(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv)
{
    static const struct option opts[] = {
        {"wait", required_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    double wait_s = 60;
    int opt;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        if (opt != 'w')
            return kvp_cli_option_other(cmd, opt, argc, argv);
        if (!kvp_cli_parse_seconds(optarg, &wait_s))
            return kvp_cli_usage_error(cmd, "--wait needs seconds (0..86400), got '%s'", optarg);
    }
    if (argc - optind != 1)
        return kvp_cli_usage_error(cmd, "drain needs one SEGMENT name (see kvpool stat)");
    const char *name = argv[optind];
    kvp_client_t *client;
    if (kvp_cli_client_open(cli, NULL, &client) != KVP_OK)
        return KVP_CLI_FAIL;
    /* what it holds before the drain begins: the progress's total */
    uint64_t first = UINT64_MAX, held = 0;
    bool present = false;
    if (drain_find(client, name, &present, &held) == KVP_OK && present)
        first = held;
    uint64_t t0 = kvp_now_ms();
    kvp_status_t st = kvp_request_drain(client, name);
    if (st != KVP_OK) {
        kvp_client_destroy(client);
        return kvp_cli_fail(kvp_cli_why(st), "drain %s", name);
    }
    /* the owner drains and unmounts; watch for the segment to go */
    kvp_progress_t *prog = NULL;
    if (kvp_cli_progress_wanted(cli, wait_s > 0))
        prog = kvp_cli_progress_start("drain", name, first == UINT64_MAX ? 0 : first, false,
                                      "replicas");
    int rc = drain_watch(client, name, wait_s, t0, first, prog);
    kvp_client_destroy(client);
    return rc;
}

/* ---- stat --------------------------------------------------------------- */

static void stat_print_json(const kvp_pool_stat_t *st)
{
    printf("{\"capacity\":%" PRIu64 ",\"used\":%" PRIu64 ",\"objects\":%" PRIu64
           ",\"pending\":%" PRIu64 ",\"evicted_objects\":%" PRIu64 ",\"evicted_bytes\":%" PRIu64
           ",\"put_timeouts\":%" PRIu64 ",\"moved_objects\":%" PRIu64
           ",\"reading_objects\":%" PRIu64 ",\"reading_bytes\":%" PRIu64
           ",\"leases_released\":%" PRIu64 ",\"leases_expired\":%" PRIu64,
           st->capacity, st->used, st->objects, st->pending, st->evicted_objects, st->evicted_bytes,
           st->put_timeouts, st->moved_objects, st->reading_objects, st->reading_bytes,
           st->leases_released, st->leases_expired);
    printf(",\"dram_capacity\":%" PRIu64 ",\"dram_used\":%" PRIu64 ",\"ssd_capacity\":%" PRIu64
           ",\"ssd_used\":%" PRIu64 ",\"offloaded_objects\":%" PRIu64
           ",\"offload_dropped\":%" PRIu64 ",\"offload_failed\":%" PRIu64
           ",\"offloading_objects\":%" PRIu64 ",\"promoted_objects\":%" PRIu64
           ",\"hits_dram\":%" PRIu64 ",\"hits_ssd\":%" PRIu64 ",\"ssd_evicted_objects\":%" PRIu64
           ",\"adopted_objects\":%" PRIu64 ",\"ssd_lost_objects\":%" PRIu64
           ",\"adopt_refused\":%" PRIu64,
           st->capacity - st->ssd_capacity, st->used - st->ssd_used, st->ssd_capacity, st->ssd_used,
           st->offloaded_objects, st->offload_dropped, st->offload_failed, st->offloading_objects,
           st->promoted_objects, st->hits_dram, st->hits_ssd, st->ssd_evicted_objects,
           st->adopted_objects, st->ssd_lost_objects, st->adopt_refused);
    fputs(",\"leader\":", stdout);
    kvp_cli_json_string(st->leader, sizeof(st->leader));
    printf(",\"epoch\":%" PRIu64 ",\"standbys\":", st->epoch);
    kvp_cli_json_string(st->standbys, sizeof(st->standbys));
    fputs(",\"segments\":[", stdout);
    for (size_t i = 0; i < st->n_segments; i++) {
        const kvp_segment_info_t *s = &st->segments[i];
        printf("%s{\"id\":%" PRIu64 ",\"name\":", i > 0 ? "," : "", s->id);
        kvp_cli_json_string(s->name, sizeof(s->name));
        fputs(",\"medium\":", stdout);
        kvp_cli_json_string(s->medium, sizeof(s->medium));
        fputs(",\"endpoint\":", stdout);
        kvp_cli_json_string(s->endpoint, sizeof(s->endpoint));
        printf(",\"size\":%" PRIu64 ",\"used\":%" PRIu64 ",\"objects\":%" PRIu64
               ",\"draining\":%s}",
               s->size, s->used, s->objects, s->draining ? "true" : "false");
    }
    fputs("]}\n", stdout);
}

/* The DRAM and SSD tiers' lines of the table (only when an SSD segment is mounted). */
static void stat_print_tiers(const kvp_pool_stat_t *st)
{
    char a[32], b[32];
    uint64_t dc = st->capacity - st->ssd_capacity, du = st->used - st->ssd_used;
    printf("dram      %s of %s (%.1f%%)\n", kvp_progress_size(du, a, sizeof(a)),
           kvp_progress_size(dc, b, sizeof(b)), dc > 0 ? 100.0 * (double)du / (double)dc : 0.0);
    printf("ssd       %s of %s (%.1f%%)\n", kvp_progress_size(st->ssd_used, a, sizeof(a)),
           kvp_progress_size(st->ssd_capacity, b, sizeof(b)),
           st->ssd_capacity > 0 ? 100.0 * (double)st->ssd_used / (double)st->ssd_capacity : 0.0);
    printf("hits      dram %" PRIu64 ", ssd %" PRIu64 "\n", st->hits_dram, st->hits_ssd);
    printf("tiering   offloaded %" PRIu64 " (in flight %" PRIu64 ", failed %" PRIu64
           ", dropped for lack of SSD room %" PRIu64 "), promoted %" PRIu64
           ", evicted from SSD %" PRIu64 ", lost %" PRIu64 "\n",
           st->offloaded_objects, st->offloading_objects, st->offload_failed, st->offload_dropped,
           st->promoted_objects, st->ssd_evicted_objects, st->ssd_lost_objects);
}

/* The segments' table, its columns as wide as their longest entry. */
static void stat_print_segments(const kvp_pool_stat_t *st)
{
    char a[32], b[32], shown[4 * sizeof(st->segments[0].name) + 3];
    int wname = 4, wmed = 6, wend = 8;
    for (size_t i = 0; i < st->n_segments; i++) {
        const kvp_segment_info_t *s = &st->segments[i];
        /* what a name really is: quoted and escaped when it is not plain (kvp_cli_shown_name) */
        kvp_cli_shown_name(s->name, sizeof(s->name), shown, sizeof(shown));
        wname = KVP_MAX(wname, (int)strlen(shown));
        wmed = KVP_MAX(wmed, (int)strnlen(s->medium, sizeof(s->medium)));
        wend = KVP_MAX(wend, (int)strnlen(s->endpoint, sizeof(s->endpoint)));
    }
    printf("\n%-*s  %-*s  %-*s  %10s  %10s  %s\n", wname, "NAME", wmed, "MEDIUM", wend, "ENDPOINT",
           "SIZE", "USED", "OBJECTS");
    for (size_t i = 0; i < st->n_segments; i++) {
        const kvp_segment_info_t *s = &st->segments[i];
        kvp_cli_shown_name(s->name, sizeof(s->name), shown, sizeof(shown));
        printf("%-*s  %-*.*s  %-*.*s  %10s  %10s  %" PRIu64 "%s\n", wname, shown, wmed, wmed,
               s->medium, wend, wend, s->endpoint, kvp_progress_size(s->size, a, sizeof(a)),
               kvp_progress_size(s->used, b, sizeof(b)), s->objects,
               s->draining ? "  (draining)" : "");
    }
}

static void stat_print_table(const kvp_pool_stat_t *st)
{
    char a[32];
    double pct = st->capacity > 0 ? 100.0 * (double)st->used / (double)st->capacity : 0.0;
    if (st->leader[0] != '\0') {
        printf("leader    %s (epoch %" PRIu64 ")\n", st->leader, st->epoch);
        printf("standbys  %s\n", st->standbys[0] ? st->standbys : "none");
    }
    printf("capacity  %s\n", kvp_progress_size(st->capacity, a, sizeof(a)));
    printf("used      %s (%.1f%%)\n", kvp_progress_size(st->used, a, sizeof(a)), pct);
    printf("objects   %" PRIu64 "\n", st->objects);
    printf("pending   %" PRIu64 "\n", st->pending);
    printf("reading   %" PRIu64 " objects, %s (leases released %" PRIu64 ", expired %" PRIu64 ")\n",
           st->reading_objects, kvp_progress_size(st->reading_bytes, a, sizeof(a)),
           st->leases_released, st->leases_expired);
    if (st->adopted_objects > 0 || st->adopt_refused > 0)
        printf("adopted   %" PRIu64 " objects brought back by segments at their mount, %" PRIu64
               " stale entries refused\n",
               st->adopted_objects, st->adopt_refused);
    if (st->ssd_capacity > 0)
        stat_print_tiers(st);
    printf("segments  %zu\n", st->n_segments);
    if (st->n_segments > 0)
        stat_print_segments(st);
}

/* --watch's line above each draw (after clearing a terminal, or a blank line between
 * draws elsewhere). */
static void stat_print_watch_header(unsigned round, double every, bool redraw)
{
    char when[64];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
    if (redraw)
        fputs("\033[H\033[2J", stdout);
    else if (round > 0)
        putchar('\n');
    printf("--- %s, every %.1f s (Ctrl-C to stop)\n", when, every);
}

/* Wait `secs` for one of `mask`'s signals (blocked in every thread); true: one came. */
static bool watch_wait(const sigset_t *mask, double secs)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)(secs * 1000);
    for (;;) {
        uint64_t now = kvp_now_ms();
        if (now >= deadline)
            return false;
        uint64_t left = deadline - now;
        struct timespec ts = {.tv_sec = (time_t)(left / 1000),
                              .tv_nsec = (long)(left % 1000) * 1000000};
        if (sigtimedwait(mask, NULL, &ts) > 0)
            return true;
        if (errno != EINTR && errno != EAGAIN)
            return false;
    }
}

/* stat's options; -1, or the exit code when stat must stop now. */
static int stat_parse(const kvp_cli_command_t *cmd, int argc, char **argv, bool *json_p,
                      bool *watch_p, double *every_p)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"watch", optional_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'j':
            *json_p = true;
            break;
        case 'w':
            *watch_p = true;
            /* --watch=N, or --watch N when the next word is a number */
            if (optarg == NULL && optind < argc && kvp_cli_parse_seconds(argv[optind], every_p))
                optarg = argv[optind++];
            if (optarg != NULL && (!kvp_cli_parse_seconds(optarg, every_p) || *every_p < 0.1))
                return kvp_cli_usage_error(cmd, "--watch needs seconds (0.1..86400), got '%s'",
                                           optarg);
            break;
        default:
            return kvp_cli_option_other(cmd, opt, argc, argv);
        }
    }
    if (optind < argc)
        return kvp_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    return -1;
}

int kvp_cli_stat(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv)
{
    bool json = false, watch = false;
    double every = 1.0;
    int rc = stat_parse(cmd, argc, argv, &json, &watch, &every);
    if (rc >= 0)
        return rc;
    /* --watch: SIGINT/SIGTERM blocked before the client's threads exist (they inherit
     * the mask), taken by the main thread between draws, as serve does */
    sigset_t mask;
    rc = kvp_cli_stop_signals(&mask, watch);
    if (rc >= 0)
        return rc;
    kvp_client_t *client;
    if (kvp_cli_client_open(cli, NULL, &client) != KVP_OK)
        return KVP_CLI_FAIL;
    /* --watch on a terminal redraws in place; elsewhere (a pipe, a log) one block after
     * another, each under a timestamp line (JSON: one object per line) */
    bool redraw = watch && !json && isatty(STDOUT_FILENO);
    rc = KVP_CLI_OK;
    for (unsigned round = 0;; round++) {
        kvp_pool_stat_t *st = NULL;
        kvp_status_t status = kvp_pool_stat(client, &st);
        if (status != KVP_OK) {
            rc = kvp_cli_fail(kvp_cli_why(status), "stat");
            break;
        }
        if (watch && !json)
            stat_print_watch_header(round, every, redraw);
        if (json)
            stat_print_json(st);
        else
            stat_print_table(st);
        kvp_pool_stat_free(st);
        if (fflush(stdout) != 0) {
            rc = kvp_cli_fail(strerror(errno), "writing stdout");
            break;
        }
        if (!watch || watch_wait(&mask, every))
            break;
    }
    kvp_client_destroy(client);
    return rc;
}
