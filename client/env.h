/*
 * env.h - the library's environment (KVPOOL_*), read once, when a client is created
 * (client.c), into a kvp_client_env_t that the layers below receive from their creators
 * (the engine's settings, the segment's and discovery's parameters) instead of calling
 * getenv themselves. See env.c for the table of variables.
 *
 * A parameter of kvp_client_params_t always wins over its variable; an empty variable is
 * unset. The table also lists, for the docs, the variables read elsewhere (its rows marked
 * KVP_OPT_F_READ_ELSEWHERE): the process-wide ones, read once per process where their
 * setting lives (KVPOOL_LOG_LEVEL: common/log.c, kvp_log_init_from_env; KVPOOL_CUDA_LIB:
 * mem/gpu.c, when the driver is loaded; KVPOOL_CRC32C_NO_FOLD: common/crc32c.c, a test
 * knob), and the transfer engine's (KVPOOL_TE_*: client/te/te.c, as each engine is created).
 */
#ifndef KVP_CLIENT_ENV_H
#define KVP_CLIENT_ENV_H

#include <stdbool.h>
#include <stdint.h>

#include "common/etcd.h"
#include "common/options.h"
#include "client/segment/conn_server.h" /* kvp_conn_limits_t */
#include "client/transfer/engine.h"     /* KVP_RDMA_WINDOWS_* */

/* The library's environment; NULL / 0 / false: the variable is not set (or empty). The
 * strings point into the environment: use them while the client is created only. */
typedef struct kvp_client_env {
    const char *master;       /* KVPOOL_MASTER */
    const char *transport;    /* KVPOOL_TRANSPORT */
    const char *rdma_devices; /* KVPOOL_RDMA_DEVICE */
    const char *rdma_host;    /* KVPOOL_RDMA_HOST */
    const char *auth;         /* KVPOOL_AUTH */
    const char *tls_cert;     /* KVPOOL_TLS_CERT */
    const char *tls_key;      /* KVPOOL_TLS_KEY */
    const char *tls_ca;       /* KVPOOL_TLS_CA */
    const char *token;        /* KVPOOL_TOKEN */
    const char *tenant_id;    /* KVPOOL_TENANT_ID */
    kvp_etcd_security_t etcd; /* KVPOOL_ETCD_CACERT, _CERT, _KEY, _USER, _PASSWORD_FILE */
    int rdma_windows;         /* KVPOOL_RDMA_WINDOWS: KVP_RDMA_WINDOWS_* */
    unsigned rdma_qp_cap;     /* KVPOOL_RDMA_QP_CAP; 0: the transport's default */
    bool keep_dumpable;       /* KVPOOL_KEEP_DUMPABLE=1 */
    const char *dfs_path;     /* KVPOOL_DFS_PATH */
    uint64_t dfs_size;        /* KVPOOL_DFS_SIZE */
    /* KVPOOL_PUT_AHEAD: holds kept at most (put_holds.h); 0 unset: KVP_PUT_AHEAD_DEFAULT;
     * KVP_PUT_AHEAD_OFF: none (every put batch makes two master calls) */
    uint32_t put_ahead;
    uint64_t put_ahead_bytes; /* KVPOOL_PUT_AHEAD_BYTES; 0 unset: KVP_PUT_AHEAD_BYTES_DEFAULT */
    /* KVPOOL_DATA_*: what peers may hold of our segments' data servers (0: not set) */
    kvp_conn_limits_t data_limits;
} kvp_client_env_t;

#define KVP_PUT_AHEAD_DEFAULT 1024u
#define KVP_PUT_AHEAD_OFF UINT32_MAX
#define KVP_PUT_AHEAD_BYTES_DEFAULT (64ull << 20)

/* Read the variables into *env. Thread: any (reads the environment). */
void kvp_client_env_read(kvp_client_env_t *env);

/* The table of the variables over *env (docs: kvpool --env-markdown). */
kvp_opts_t kvp_client_env_table(kvp_client_env_t *env);

/* The transfer engine's environment (KVPOOL_TE_*, KVPOOL_TLS_CRL), read as each engine is
 * created (client/te/te.c): typed and range-checked, its defaults filled in. The strings
 * point into the environment. */
typedef struct kvp_te_env {
    uint32_t timeout_ms;     /* KVPOOL_TE_TIMEOUT_MS */
    uint32_t streams;        /* KVPOOL_TE_STREAMS */
    uint64_t chain;          /* KVPOOL_TE_CHAIN */
    uint64_t stage_chunk;    /* KVPOOL_TE_STAGE_CHUNK */
    const char *peers;       /* KVPOOL_TE_PEERS; NULL: unset */
    const char *tls_crl;     /* KVPOOL_TLS_CRL */
    const char *acl;         /* KVPOOL_TE_ACL */
    const char *shm;         /* KVPOOL_TE_SHM: "cma", "cma-checked" or "socket" */
    uint32_t copy_threads;   /* KVPOOL_TE_COPY_THREADS */
    const char *rdma_device; /* KVPOOL_RDMA_DEVICE; NULL: unset */
    const char *rdma_host;   /* KVPOOL_RDMA_HOST (an IPv4 address, checked); NULL: unset */
} kvp_te_env_t;

/* Read them into *env: KVP_OK, or KVP_ERR_INVALID_ARG with a sentence naming the variable and
 * what it needs in err. Thread: any (reads the environment). */
kvp_status_t kvp_te_env_read(kvp_te_env_t *env, char *err, size_t err_len);
kvp_opts_t kvp_te_env_table(kvp_te_env_t *env);

#endif
