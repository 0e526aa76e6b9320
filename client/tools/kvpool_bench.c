/*
 * kvpool_bench.c - throughput of batch_put_from / batch_get_into against a
 * running pool (the start of kvpool-bench; more modes come with issue 5).
 *
 *   kvpool-bench [--master HOST:PORT] [--transport auto|tcp|shm]
 *                [--size BYTES] [--batch N] [--rounds N] [--json]
 *
 * Each round puts `batch` objects of `size` bytes with one batch_put_from,
 * reads them back with one batch_get_into (CRC32C checked, as users get
 * it), then removes them. Reports GB/s (10^9 bytes/s) and objects/s for
 * put and get over all rounds; the first round is a warm-up and not
 * counted.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/include/kvpool.h"
#include "common/util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    const char *master = NULL, *transport = NULL;
    uint64_t size = 1 << 20;
    unsigned batch = 32, rounds = 20;
    int json = 0;
    static const struct option opts[] = {
        {"master", required_argument, NULL, 'm'}, {"transport", required_argument, NULL, 't'},
        {"size", required_argument, NULL, 's'},   {"batch", required_argument, NULL, 'b'},
        {"rounds", required_argument, NULL, 'r'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'm':
            master = optarg;
            break;
        case 't':
            transport = optarg;
            break;
        case 's':
            if (!kvp_parse_size(optarg, &size) || size == 0) {
                fprintf(stderr, "kvpool-bench: bad --size '%s'\n", optarg);
                return 2;
            }
            break;
        case 'b':
            batch = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'r':
            rounds = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'j':
            json = 1;
            break;
        default:
            fprintf(stderr, "usage: kvpool-bench [--master HOST:PORT] [--transport "
                            "auto|tcp|shm] [--size BYTES] [--batch N] [--rounds N] [--json]\n");
            return o == 'h' ? 0 : 2;
        }
    }
    if (batch == 0 || batch > KVP_MAX_BATCH || rounds < 2) {
        fprintf(stderr, "kvpool-bench: need 1 <= batch <= %d and rounds >= 2\n", KVP_MAX_BATCH);
        return 2;
    }
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = master;
    p.transport = transport;
    kvp_client_t *c;
    kvp_status_t st = kvp_client_create(&p, &c);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench: cannot connect: %s\n", kvp_strerror(st));
        return 1;
    }
    char **keys = calloc(batch, sizeof(*keys));
    void **src = calloc(batch, sizeof(*src)), **dst = calloc(batch, sizeof(*dst));
    size_t *sizes = calloc(batch, sizeof(*sizes));
    kvp_status_t *res = calloc(batch, sizeof(*res));
    int64_t *got = calloc(batch, sizeof(*got));
    for (unsigned i = 0; i < batch; i++) {
        keys[i] = malloc(64);
        src[i] = malloc(size);
        dst[i] = malloc(size);
        sizes[i] = size;
        memset(src[i], (int)(i * 13 + 1), size);
        memset(dst[i], 0, size);
        kvp_register_buffer(c, src[i], size);
        kvp_register_buffer(c, dst[i], size);
    }
    double t_put = 0, t_get = 0;
    int rc = 0;
    for (unsigned r = 0; r < rounds && rc == 0; r++) {
        for (unsigned i = 0; i < batch; i++)
            snprintf(keys[i], 64, "bench-%u-%u", r, i);
        double t0 = now_s();
        st = kvp_batch_put_from(c, (const char *const *)keys, (const void *const *)src, sizes,
                                batch, NULL, res);
        double t1 = now_s();
        if (st == KVP_OK)
            st = kvp_batch_get_into(c, (const char *const *)keys, dst, sizes, batch, got);
        double t2 = now_s();
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench: round %u failed: %s\n", r, kvp_strerror(st));
            rc = 1;
        }
        if (r > 0) {
            t_put += t1 - t0;
            t_get += t2 - t1;
        }
        kvp_batch_remove(c, (const char *const *)keys, batch, res);
    }
    if (rc == 0 && memcmp(src[batch - 1], dst[batch - 1], size) != 0) {
        fprintf(stderr, "kvpool-bench: bytes differ\n");
        rc = 1;
    }
    if (rc == 0) {
        double bytes = (double)size * batch * (rounds - 1);
        double objs = (double)batch * (rounds - 1);
        const char *tr = transport ? transport : "auto";
        if (json)
            printf("{\"transport\":\"%s\",\"size\":%llu,\"batch\":%u,\"rounds\":%u,"
                   "\"put_gbps\":%.3f,\"get_gbps\":%.3f,\"put_objs_per_s\":%.0f,"
                   "\"get_objs_per_s\":%.0f}\n",
                   tr, (unsigned long long)size, batch, rounds - 1, bytes / t_put / 1e9,
                   bytes / t_get / 1e9, objs / t_put, objs / t_get);
        else
            printf("transport %-4s size %8llu batch %4u: put %6.2f GB/s %9.0f obj/s | "
                   "get %6.2f GB/s %9.0f obj/s\n",
                   tr, (unsigned long long)size, batch, bytes / t_put / 1e9, objs / t_put,
                   bytes / t_get / 1e9, objs / t_get);
    }
    for (unsigned i = 0; i < batch; i++) {
        kvp_unregister_buffer(c, src[i]);
        kvp_unregister_buffer(c, dst[i]);
        free(keys[i]);
        free(src[i]);
        free(dst[i]);
    }
    free(keys);
    free(src);
    free(dst);
    free(sizes);
    free(res);
    free(got);
    kvp_client_destroy(c);
    return rc;
}
