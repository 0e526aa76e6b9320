/*
 * kvpool-example.c: the smallest C user of libkvpool, built against an
 * installed kvpool (the Debian package, or `meson install`) through pkg-config:
 *
 *   cc kvpool-example.c $(pkg-config --cflags --libs kvpool) -o kvpool-example
 *   ./kvpool-example 127.0.0.1:50051
 *
 * It connects to the master, stores one object, reads it back into a buffer
 * of its own and checks the bytes, then removes it. The pool needs memory to
 * put into: a `kvpool serve --segment-size ...`, or this client's own segment
 * (KVPOOL_EXAMPLE_SEGMENT=64MiB mounts one of 64 MiB).
 * Exit status 0 when the bytes came back equal.
 */
#include <kvpool.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    kvp_client_params_t params;
    kvp_client_params_init(&params);
    params.master_addr = argc > 1 ? argv[1] : NULL; /* NULL: $KVPOOL_MASTER */
    if (getenv("KVPOOL_EXAMPLE_SEGMENT") != NULL)
        params.segment_size = 64u << 20;

    kvp_client_t *client;
    kvp_status_t st = kvp_client_create(&params, &client);
    if (st != KVP_OK) {
        fprintf(stderr, "connect: %s (%s)\n", kvp_strerror(st), kvp_client_last_error());
        return 1;
    }

    const char *key = "example/hello";
    char value[4096];
    for (size_t i = 0; i < sizeof(value); i++)
        value[i] = (char)(i * 31 + 7);

    int rc = 1;
    st = kvp_put(client, key, value, sizeof(value), NULL);
    if (st != KVP_OK && st != KVP_ERR_EXISTS) {
        fprintf(stderr, "put: %s (%s)\n", kvp_strerror(st), kvp_client_last_error());
        goto out_destroy;
    }

    char back[sizeof(value)];
    int64_t n = kvp_get_into(client, key, back, sizeof(back));
    if (n < 0) {
        fprintf(stderr, "get: %s (%s)\n", kvp_strerror((kvp_status_t)n), kvp_client_last_error());
        goto out_destroy;
    }
    if ((size_t)n != sizeof(value) || memcmp(back, value, sizeof(value)) != 0) {
        fprintf(stderr, "get: %lld bytes that differ from what was put\n", (long long)n);
        goto out_destroy;
    }
    printf("put and got back %lld bytes under %s: equal\n", (long long)n, key);
    rc = kvp_remove(client, key) == KVP_OK ? 0 : 1;

out_destroy:
    kvp_client_destroy(client);
    return rc;
}
