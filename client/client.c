/*
 * client.c - a client's life: parameters, create (connect to the master,
 * create and mount the client's own segment, start the heartbeat) and
 * destroy (drain the segment, stop, free).
 *
 * The other parts of the client live beside this file: the object flows
 * (object.c), the master connection (control/master_conn.c), heartbeat and
 * drain (control/), the peer table and transfer engine (transfer/), the
 * transports (transport/), the segment server (segment/) and the registered
 * buffers (mem/registry.c).
 *
 * Threads: every API call may come from any thread. The master connection
 * is shared by all of them (control/mconn.c: requests in flight together,
 * no lock held while waiting); peer_lock (a rwlock) guards the peer table,
 * the registry's lock the registrations (lookups take none). No lock is held
 * across a data transfer.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/client_priv.h"
#include "client/ssd/ssd_owner.h"
#include "client/control/discovery.h"
#include "client/control/mconn.h"
#include "client/control/record.h"
#include "client/internal.h"
#include "client/mem/gpu.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/macros.h"
#include "common/parse.h"
#include "common/rand.h"
#include "kvpool.pb-c.h"

void kvp_client_params_init(kvp_client_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->size = sizeof(*p);
    p->verify_crc = 1;
}

void kvp_put_config_init(kvp_put_config_t *c)
{
    memset(c, 0, sizeof(*c));
    c->size = sizeof(*c);
    c->replica_num = 1;
}

const char *kvp_client_segment_name(const kvp_client_t *client)
{
    return client->seg_base ? client->seg_name : NULL;
}

const char *kvp_client_ssd_segment_name(const kvp_client_t *client)
{
    return client->ssd ? kvp_ssd_owner_name(client->ssd) : NULL;
}

/* ---------------- create / destroy ---------------- */

static kvp_status_t segment_create(kvp_client_t *c)
{
    c->seg_size = c->params.segment_size;
    c->seg_fd = memfd_create("kvpool-segment", MFD_CLOEXEC);
    if (c->seg_fd < 0)
        return kvp_status_from_errno(errno);
    if (ftruncate(c->seg_fd, (off_t)c->seg_size) != 0) {
        KVP_LOG_ERROR("cannot size a %llu-byte segment: %m", (unsigned long long)c->seg_size);
        return kvp_status_from_errno(errno);
    }
    /* Fault the whole segment in now: the memory is really there once mounted, and no
     * put pays a first-touch page fault on the data path. */
    void *base =
        mmap(NULL, c->seg_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, c->seg_fd, 0);
    if (base == MAP_FAILED)
        return kvp_status_from_errno(errno);
    c->seg_base = base;
    snprintf(c->seg_shm_path, sizeof(c->seg_shm_path), "/proc/%d/fd/%d", (int)getpid(), c->seg_fd);
    const char *host = c->params.data_host ? c->params.data_host : "127.0.0.1";
    uint16_t port;
    kvp_status_t st = kvp_segment_server_create(base, c->seg_size, host, c->params.data_port,
                                                &c->seg_server, &port);
    if (st != KVP_OK)
        return st;
    snprintf(c->seg_endpoint, sizeof(c->seg_endpoint), strchr(host, ':') ? "[%s]:%u" : "%s:%u",
             host, port);
    st = kvp_transfer_serve_segment(&c->xfer, base, c->seg_size, c->seg_rdma_endpoint,
                                    sizeof(c->seg_rdma_endpoint), &c->seg_rdma_addr,
                                    &c->seg_rdma_rkey);
    if (st != KVP_OK)
        return st;
    if (c->params.segment_name != NULL)
        snprintf(c->seg_name, sizeof(c->seg_name), "%s", c->params.segment_name);
    else
        snprintf(c->seg_name, sizeof(c->seg_name), "%s", c->seg_endpoint);
    return KVP_OK;
}

/* A new leader (discovery.c's watch thread): drop a connection to another master now;
 * the next call (or the heartbeat) connects to the leader and remounts there. One that
 * already went to the new leader by itself is kept. */
static void leader_changed(void *arg, const char *leader)
{
    kvp_client_t *c = arg;
    KVP_LOG_INFO("the master's leader is now %s", leader);
    if (c->mc != NULL)
        kvp_mconn_follow(c->mc, leader);
    kvp_ssd_owner_follow(c->ssd, leader);
}

static kvp_status_t client_create_impl(const kvp_client_params_t *params, kvp_client_t **client_p)
{
    kvp_log_init_from_env();
    if (params == NULL || client_p == NULL || params->size < sizeof(size_t))
        return KVP_ERR_INVALID_ARG;
    kvp_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVP_ERR_NOMEM;
    kvp_client_params_init(&c->params);
    memcpy(&c->params, params, KVP_MIN(params->size, sizeof(c->params)));
    c->params.size = sizeof(c->params);
    c->seg_fd = -1;
    pthread_mutex_init(&c->seg_lock, NULL);
    pthread_mutex_init(&c->rel_lock, NULL);
    pthread_rwlock_init(&c->peer_lock, NULL);
    kvp_peer_table_init(&c->peers);
    c->client_id = kvp_random_u64();

    kvp_status_t st = KVP_ERR_INVALID_ARG;
    const char *master = c->params.master_addr ? c->params.master_addr : getenv("KVPOOL_MASTER");
    if (master == NULL || master[0] == '\0')
        master = "127.0.0.1:50051";
    if (kvp_discovery_is_etcd(master)) {
        /* high availability: the leader is found (and followed) through etcd */
        uint32_t t = c->params.rpc_timeout_ms ? c->params.rpc_timeout_ms : 10000;
        if (kvp_discovery_create(master, t, leader_changed, c, &c->disc) != KVP_OK) {
            KVP_LOG_ERROR("master address must be etcd://HOST:PORT[,HOST:PORT...]/CLUSTER, "
                          "got '%s'",
                          master);
            kvp_api_fail("create: master address must be HOST:PORT or "
                         "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER, got '%s'",
                         master);
            goto err;
        }
    } else if (kvp_parse_hostport(master, c->master_host, sizeof(c->master_host),
                                  &c->master_port) != KVP_OK) {
        KVP_LOG_ERROR("master address must be HOST:PORT, got '%s'", master);
        kvp_api_fail("create: master address must be HOST:PORT or "
                     "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER, got '%s'",
                     master);
        goto err;
    }
    const char *tr = c->params.transport ? c->params.transport : getenv("KVPOOL_TRANSPORT");
    if (tr == NULL || tr[0] == '\0' || strcmp(tr, "auto") == 0) {
        c->xfer.forced = KVP_TRANSPORT_AUTO;
    } else if (strcmp(tr, "tcp") == 0) {
        c->xfer.forced = KVP_TRANSPORT_TCP;
    } else if (strcmp(tr, "shm") == 0) {
        c->xfer.forced = KVP_TRANSPORT_SHM;
    } else if (strcmp(tr, "rdma") == 0) {
        c->xfer.forced = KVP_TRANSPORT_RDMA;
    } else {
        KVP_LOG_ERROR("unknown transport '%s' (auto, tcp, shm, rdma)", tr);
        kvp_api_fail("create: unknown transport '%s' (auto, tcp, shm, rdma)", tr);
        goto err;
    }
    const char *rdev =
        c->params.rdma_devices ? c->params.rdma_devices : getenv("KVPOOL_RDMA_DEVICE");
    const char *rhost = c->params.rdma_host ? c->params.rdma_host : getenv("KVPOOL_RDMA_HOST");
    if ((rdev && strlen(rdev) >= sizeof(c->xfer.rdma_devices)) ||
        (rhost && strlen(rhost) >= sizeof(c->xfer.rdma_host))) {
        KVP_LOG_ERROR("rdma device list or host too long");
        kvp_api_fail("create: rdma device list or host too long");
        goto err;
    }
    snprintf(c->xfer.rdma_devices, sizeof(c->xfer.rdma_devices), "%s", rdev ? rdev : "");
    snprintf(c->xfer.rdma_host, sizeof(c->xfer.rdma_host), "%s", rhost ? rhost : "");
    if (c->params.rdma_qps_per_peer > 16 ||
        (c->params.rdma_slice_bytes != 0 &&
         (c->params.rdma_slice_bytes < 4096 || c->params.rdma_slice_bytes > (1u << 30)))) {
        KVP_LOG_ERROR("rdma_qps_per_peer must be 0..16 and rdma_slice_bytes 4 KiB..1 GiB");
        kvp_api_fail("create: rdma_qps_per_peer must be 0..16 and rdma_slice_bytes 4 KiB..1 GiB "
                     "(got %u and %llu)",
                     c->params.rdma_qps_per_peer, (unsigned long long)c->params.rdma_slice_bytes);
        goto err;
    }
    c->xfer.rdma_qps = c->params.rdma_qps_per_peer;
    c->xfer.rdma_slice = c->params.rdma_slice_bytes;
    if (c->params.ssd_path != NULL &&
        (c->params.ssd_path[0] == '\0' || c->params.ssd_size < (1u << 20))) {
        KVP_LOG_ERROR("an SSD segment needs a path and a size of at least 1 MiB");
        kvp_api_fail("create: an SSD segment needs a path and a size of at least 1 MiB (got "
                     "'%s', %llu bytes)",
                     c->params.ssd_path, (unsigned long long)c->params.ssd_size);
        goto err;
    }
    if (c->params.rpc_timeout_ms == 0)
        c->params.rpc_timeout_ms = 10000;
    if (c->params.heartbeat_ms == 0)
        c->params.heartbeat_ms = 1000;
    if (c->params.drain_timeout_ms == 0)
        c->params.drain_timeout_ms = 30000;
    if (c->params.tcp_streams == 0)
        c->params.tcp_streams = 2;
    if (c->params.tcp_slice_bytes == 0)
        c->params.tcp_slice_bytes = 1 << 20;
    if (c->params.tcp_streams > 64 || c->params.tcp_slice_bytes < 4096) {
        KVP_LOG_ERROR("tcp_streams must be 1..64 and tcp_slice_bytes at least 4 KiB (got %u and "
                      "%llu)",
                      c->params.tcp_streams, (unsigned long long)c->params.tcp_slice_bytes);
        kvp_api_fail("create: tcp_streams must be 1..64 and tcp_slice_bytes at least 4 KiB (got "
                     "%u and %llu)",
                     c->params.tcp_streams, (unsigned long long)c->params.tcp_slice_bytes);
        goto err;
    }
    /* keep only what outlives the call: the strings are borrowed */
    c->params.master_addr = NULL;
    c->params.transport = NULL;
    c->params.rdma_devices = NULL;
    c->params.rdma_host = NULL;
    c->params.segment_name = c->params.segment_name; /* copied in segment_create */
    c->xfer.timeout_ms = c->params.rpc_timeout_ms;
    c->xfer.tcp_streams = c->params.tcp_streams;
    c->xfer.tcp_slice = c->params.tcp_slice_bytes;
    c->xfer.client_id = c->client_id;
    kvp_host_id(c->xfer.host_id, sizeof(c->xfer.host_id));
    st = kvp_transfer_init(&c->xfer);
    if (st != KVP_OK)
        goto err;

    if (c->params.segment_size > 0) {
        st = kvp_seg_record_create(&c->record);
        if (st == KVP_OK)
            st = segment_create(c);
        c->params.data_host = NULL;
        c->params.segment_name = NULL;
        if (st != KVP_OK)
            goto err_seg;
        atomic_store(&c->seg_state, KVP_SEG_MOUNTED);
    }
    const char *ssd_host = c->params.data_host ? c->params.data_host : "127.0.0.1";
    char ssd_host_buf[256];
    snprintf(ssd_host_buf, sizeof(ssd_host_buf), "%s", ssd_host);
    c->params.data_host = NULL;
    c->params.segment_name = NULL;
    st = kvp_client_master_open(c);
    if (st == KVP_OK)
        st = kvp_client_heartbeat_start(c);
    if (st == KVP_OK)
        st = kvp_client_record_start(c);
    if (st == KVP_OK)
        st = kvp_client_record_wait_open(c); /* the segment takes puts when create returns */
    if (st == KVP_OK && c->params.ssd_path != NULL)
        st = kvp_ssd_owner_start(c, ssd_host_buf, &c->ssd);
    c->params.ssd_path = NULL;
    if (st != KVP_OK) {
        kvp_client_record_stop(c);
        kvp_client_heartbeat_stop(c);
        goto err_seg;
    }
    *client_p = c;
    return KVP_OK;

err_seg:
    kvp_segment_server_destroy(c->seg_server);
    kvp_peer_table_cleanup(&c->peers);
    kvp_transfer_cleanup(&c->xfer); /* deregisters the segment before it is unmapped */
    if (c->seg_base)
        munmap(c->seg_base, c->seg_size);
    if (c->seg_fd >= 0)
        close(c->seg_fd);
    goto err;
err:
    kvp_discovery_stop(c->disc);
    kvp_client_master_close(c);
    kvp_discovery_destroy(c->disc);
    kvp_seg_record_destroy(c->record);
    pthread_mutex_destroy(&c->seg_lock);
    pthread_mutex_destroy(&c->rel_lock);
    pthread_rwlock_destroy(&c->peer_lock);
    free(c);
    return st;
}

kvp_status_t kvp_client_create(const kvp_client_params_t *params, kvp_client_t **client_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(client_create_impl(params, client_p), "create");
}

void kvp_client_destroy(kvp_client_t *c)
{
    if (c == NULL)
        return;
    kvp_discovery_stop(c->disc);  /* no leader-change callback from now on */
    kvp_client_record_signal(c);  /* its stream ends within 100 ms */
    kvp_client_heartbeat_stop(c); /* also waits for a drain in progress */
    kvp_ssd_owner_stop(c->ssd);   /* unmounts it: its file keeps the objects */
    c->ssd = NULL;
    int seg_state = atomic_load(&c->seg_state);
    if (seg_state == KVP_SEG_MOUNTED || seg_state == KVP_SEG_DRAINING) {
        /* no remount races this: the heartbeat has stopped and no call is in progress */
        atomic_store(&c->seg_state, KVP_SEG_DRAINED);
        if (kvp_mconn_connected(c->mc)) {
            Kvpool__UnmountRequest req = KVPOOL__UNMOUNT_REQUEST__INIT;
            req.segment_id = atomic_load(&c->seg_id);
            uint8_t *resp = NULL;
            size_t rlen;
            kvp_client_call(c, KVP_RPC_UNMOUNT, &req.base, &resp, &rlen); /* best effort */
        }
    }
    kvp_client_record_stop(c);
    kvp_client_master_close(c);
    kvp_discovery_destroy(c->disc);
    kvp_seg_record_destroy(c->record);
    kvp_segment_server_destroy(c->seg_server);
    kvp_peer_table_cleanup(&c->peers); /* detaches them from the transports */
    kvp_transfer_cleanup(&c->xfer);    /* deregisters the buffers still registered */
    if (c->seg_base)
        munmap(c->seg_base, c->seg_size);
    if (c->seg_fd >= 0)
        close(c->seg_fd);
    pthread_mutex_destroy(&c->seg_lock);
    pthread_mutex_destroy(&c->rel_lock);
    pthread_rwlock_destroy(&c->peer_lock);
    free(c);
}
