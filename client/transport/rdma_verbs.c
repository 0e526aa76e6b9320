/*
 * rdma_verbs.c - the verbs layer under the rdma transport (see rdma_verbs.h).
 *
 * Design: a device is the verbs context that librdmacm itself uses
 * (rdma_get_devices), so rdma_cm ids resolve to the same context as our PD
 * and CQ. Every QP of a device shares its one CQ; a QP sits in the device's
 * table at a small index, and every WR's ibv wr_id is (index << 48 | seq),
 * seq counting the QP's posted WRs. The QP keeps, per send-queue slot, the
 * caller's wr_id and whether the WR ends its chain, so a completion maps
 * back to the caller's WR without a search, and the chain end advances the
 * QP's "done" counter, which bounds the work in flight.
 *
 * Invariants: posted - done <= qp depth; seq % depth names the slot of a WR
 * in flight; completions of a destroyed QP (qp_num mismatch or empty slot)
 * are dropped.
 *
 * Threads: `posted` is written by the posting thread, `done` and `error` by
 * the polling thread; both atomics. The QP table is guarded by dev->lock
 * (taken once per poll batch). rdma_cm events of accepted QPs arrive on the
 * listener's channel and are consumed by kvp_rdma_accept.
 */
#include "client/transport/rdma_verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define SEQ_BITS 48
#define SEQ_MASK ((UINT64_C(1) << SEQ_BITS) - 1)
#define MAX_QPS 65535u
#define POLL_BATCH 32
#define MAX_RD_ATOMIC 16

struct kvp_rdma_dev {
    struct ibv_context **list; /* rdma_get_devices(), freed at close */
    struct ibv_context *ctx;   /* borrowed from list */
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    kvp_rdma_dev_info_t info;
    unsigned qp_depth;
    uint8_t max_init_rd, max_rd;
    pthread_mutex_t lock; /* qps[] */
    kvp_rdma_qp_t **qps;
    unsigned qps_cap;
};

typedef struct wr_slot {
    uint64_t wr_id;
    bool last;
} wr_slot_t;

struct kvp_rdma_qp {
    kvp_rdma_dev_t *dev;
    struct rdma_cm_id *id;
    struct rdma_event_channel *own_ch; /* connector's; NULL when accepted */
    struct ibv_qp *ibqp;
    unsigned idx; /* in dev->qps */
    unsigned depth;
    wr_slot_t *slots; /* depth entries */
    _Atomic uint64_t posted;
    _Atomic uint64_t done;
    atomic_bool error;
    atomic_bool disconnected;
    bool connected;
    uint8_t peer_pdata[KVP_RDMA_ACCEPT_PDATA_MAX];
    size_t peer_pdata_len;
};

struct kvp_rdma_listener {
    kvp_rdma_dev_t *dev;
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
};

static _Thread_local char err_text[512] = "no error";

const char *kvp_rdma_last_error(void)
{
    return err_text;
}

/* Record the error text for this thread; returns -err for `return fail(...)`. */
__attribute__((format(printf, 2, 3))) static int fail(int err, const char *fmt, ...)
{
    /* format into a copy: the arguments may include err_text itself */
    char buf[sizeof(err_text)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    memcpy(err_text, buf, sizeof(buf));
    return err > 0 ? -err : (err < 0 ? err : -EIO);
}

const char *kvp_rdma_wc_status_str(kvp_rdma_wc_status_t status)
{
    switch (status) {
    case KVP_RDMA_WC_OK:
        return "ok";
    case KVP_RDMA_WC_REMOTE_ACCESS:
        return "remote access error";
    case KVP_RDMA_WC_RETRY_EXCEEDED:
        return "retry exceeded";
    case KVP_RDMA_WC_FLUSHED:
        return "flushed";
    case KVP_RDMA_WC_OTHER:
        break;
    }
    return "other error";
}

static kvp_rdma_wc_status_t map_wc_status(enum ibv_wc_status s)
{
    switch (s) {
    case IBV_WC_SUCCESS:
        return KVP_RDMA_WC_OK;
    case IBV_WC_REM_ACCESS_ERR:
        return KVP_RDMA_WC_REMOTE_ACCESS;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return KVP_RDMA_WC_RETRY_EXCEEDED;
    case IBV_WC_WR_FLUSH_ERR:
        return KVP_RDMA_WC_FLUSHED;
    default:
        return KVP_RDMA_WC_OTHER;
    }
}

static unsigned mtu_bytes(enum ibv_mtu mtu)
{
    return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128u << mtu : 0;
}

static int parse_ipv4(const char *ipv4, uint16_t port, struct sockaddr_in *sin)
{
    memset(sin, 0, sizeof(*sin));
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    if (ipv4 == NULL || inet_pton(AF_INET, ipv4, &sin->sin_addr) != 1)
        return fail(EINVAL, "'%s' is not an IPv4 address", ipv4 ? ipv4 : "(null)");
    return 0;
}

/* ---------------------------------------------------------------- device */

/* Is port `port` of ctx usable? Fills info; appends why not to `why`. */
static bool port_usable(struct ibv_context *ctx, uint8_t port, const struct in_addr *ip,
                        kvp_rdma_dev_info_t *info, char *why, size_t why_len)
{
    const char *name = ibv_get_device_name(ctx->device);
    size_t used = strlen(why);
    struct ibv_port_attr pa;
    if (ibv_query_port(ctx, port, &pa) != 0) {
        snprintf(why + used, why_len - used, "; %s port %u: ibv_query_port: %s", name, port,
                 strerror(errno));
        return false;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
        snprintf(why + used, why_len - used, "; %s port %u: %s", name, port,
                 ibv_port_state_str(pa.state));
        return false;
    }
    memset(info, 0, sizeof(*info));
    snprintf(info->name, sizeof(info->name), "%s", name);
    info->port = port;
    info->active_mtu = mtu_bytes(pa.active_mtu);
    info->roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    info->gid_index = -1;
    if (ip == NULL)
        return true;
    if (!info->roce) {
        info->gid_index = 0; /* InfiniBand: rdma_cm resolves IPoIB itself */
        return true;
    }
    uint8_t want[16] = {0};
    want[10] = want[11] = 0xff;
    memcpy(want + 12, &ip->s_addr, 4);
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0) != 0)
            continue; /* empty entry */
        if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && memcmp(e.gid.raw, want, 16) == 0) {
            info->gid_index = i;
            return true;
        }
    }
    char ipbuf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, ip, ipbuf, sizeof(ipbuf));
    snprintf(why + used, why_len - used, "; %s port %u: no RoCE v2 GID for %s", name, port, ipbuf);
    return false;
}

static bool name_listed(const char *names, const char *name)
{
    if (names == NULL || names[0] == '\0' || strcmp(names, "auto") == 0)
        return true;
    size_t n = strlen(name);
    for (const char *p = names; *p != '\0';) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return true;
        p += len + (end ? 1 : 0);
    }
    return false;
}

int kvp_rdma_dev_open(const kvp_rdma_dev_params_t *params, kvp_rdma_dev_t **dev_p)
{
    struct in_addr ip, *ipp = NULL;
    if (params->ipv4 != NULL) {
        if (inet_pton(AF_INET, params->ipv4, &ip) != 1)
            return fail(EINVAL, "'%s' is not an IPv4 address", params->ipv4);
        ipp = &ip;
    }
    kvp_rdma_dev_t *dev = calloc(1, sizeof(*dev));
    if (dev == NULL)
        return fail(ENOMEM, "out of memory");
    int rc;
    int n = 0;
    errno = 0;
    dev->list = rdma_get_devices(&n);
    if (dev->list == NULL || n == 0) {
        rc = fail(ENODEV, "no RDMA device on this host (rdma_get_devices: %s)",
                  errno ? strerror(errno) : "empty list");
        goto err_free_list;
    }
    char why[384] = "";
    for (int i = 0; i < n && dev->ctx == NULL; i++) {
        struct ibv_context *ctx = dev->list[i];
        if (!name_listed(params->device_names, ibv_get_device_name(ctx->device)))
            continue;
        struct ibv_device_attr da;
        if (ibv_query_device(ctx, &da) != 0) {
            size_t used = strlen(why);
            snprintf(why + used, sizeof(why) - used, "; %s: ibv_query_device: %s",
                     ibv_get_device_name(ctx->device), strerror(errno));
            continue;
        }
        for (uint8_t port = 1; port <= da.phys_port_cnt; port++) {
            if (port_usable(ctx, port, ipp, &dev->info, why, sizeof(why))) {
                dev->ctx = ctx;
                dev->max_init_rd =
                    (uint8_t)(da.max_qp_init_rd_atom < MAX_RD_ATOMIC ? da.max_qp_init_rd_atom
                                                                     : MAX_RD_ATOMIC);
                dev->max_rd = (uint8_t)(da.max_qp_rd_atom < MAX_RD_ATOMIC ? da.max_qp_rd_atom
                                                                          : MAX_RD_ATOMIC);
                break;
            }
        }
    }
    if (dev->ctx == NULL) {
        rc = fail(ENODEV, "no usable RDMA device (devices: %s%s)",
                  params->device_names ? params->device_names : "auto",
                  why[0] ? why : "; none matched");
        goto err_free_list;
    }
    dev->qp_depth = params->qp_depth ? params->qp_depth : 128;
    dev->pd = ibv_alloc_pd(dev->ctx);
    if (dev->pd == NULL) {
        rc = fail(errno, "%s: ibv_alloc_pd: %s", dev->info.name, strerror(errno));
        goto err_free_list;
    }
    dev->ch = ibv_create_comp_channel(dev->ctx);
    if (dev->ch == NULL) {
        rc = fail(errno, "%s: ibv_create_comp_channel: %s", dev->info.name, strerror(errno));
        goto err_dealloc_pd;
    }
    int cqe = (int)(params->cq_depth ? params->cq_depth : 4096);
    dev->cq = ibv_create_cq(dev->ctx, cqe, dev, dev->ch, 0);
    if (dev->cq == NULL) {
        rc = fail(errno, "%s: ibv_create_cq(%d): %s", dev->info.name, cqe, strerror(errno));
        goto err_destroy_ch;
    }
    pthread_mutex_init(&dev->lock, NULL);
    *dev_p = dev;
    return 0;

err_destroy_ch:
    ibv_destroy_comp_channel(dev->ch);
err_dealloc_pd:
    ibv_dealloc_pd(dev->pd);
err_free_list:
    if (dev->list)
        rdma_free_devices(dev->list);
    free(dev);
    return rc;
}

void kvp_rdma_dev_close(kvp_rdma_dev_t *dev)
{
    if (dev == NULL)
        return;
    ibv_destroy_cq(dev->cq);
    ibv_destroy_comp_channel(dev->ch);
    ibv_dealloc_pd(dev->pd);
    rdma_free_devices(dev->list);
    pthread_mutex_destroy(&dev->lock);
    free(dev->qps);
    free(dev);
}

const kvp_rdma_dev_info_t *kvp_rdma_dev_info(const kvp_rdma_dev_t *dev)
{
    return &dev->info;
}

int kvp_rdma_dev_access_errors(kvp_rdma_dev_t *dev)
{
    int fl = fcntl(dev->ctx->async_fd, F_GETFL);
    if (fl < 0 || (!(fl & O_NONBLOCK) && fcntl(dev->ctx->async_fd, F_SETFL, fl | O_NONBLOCK) != 0))
        return -errno;
    int n = 0;
    struct ibv_async_event ev;
    while (ibv_get_async_event(dev->ctx, &ev) == 0) {
        n += ev.event_type == IBV_EVENT_QP_ACCESS_ERR;
        ibv_ack_async_event(&ev);
    }
    return n;
}

int64_t kvp_rdma_dev_nic_access_errors(const kvp_rdma_dev_t *dev)
{
    char path[256];
    snprintf(path, sizeof(path),
             "/sys/class/infiniband/%s/ports/%u/hw_counters/resp_remote_access_errors",
             dev->info.name, dev->info.port);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1)
        v = -1;
    fclose(f);
    return v;
}

int kvp_rdma_dev_ipv4(const kvp_rdma_dev_t *dev, char *buf, size_t len)
{
    struct ibv_port_attr pa;
    if (ibv_query_port(dev->ctx, dev->info.port, &pa) != 0)
        return fail(errno, "%s: ibv_query_port: %s", dev->info.name, strerror(errno));
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        if (ibv_query_gid_ex(dev->ctx, dev->info.port, (uint32_t)i, &e, 0) != 0)
            continue;
        if (e.gid_type != IBV_GID_TYPE_ROCE_V2 || memcmp(e.gid.raw, v4mapped, 12) != 0)
            continue;
        if (inet_ntop(AF_INET, e.gid.raw + 12, buf, (socklen_t)len) == NULL)
            return fail(errno, "inet_ntop: %s", strerror(errno));
        return 0;
    }
    return fail(ENOENT, "%s port %u has no RoCE v2 GID with an IPv4 address", dev->info.name,
                dev->info.port);
}

unsigned kvp_rdma_dev_cq_depth(const kvp_rdma_dev_t *dev)
{
    return (unsigned)dev->cq->cqe;
}

int kvp_rdma_dev_fd(const kvp_rdma_dev_t *dev)
{
    return dev->ch->fd;
}

/* ---------------------------------------------------------------- memory */

/* Register [addr, addr+len) with `access` (what: its name for the error). */
static int mr_reg_access(kvp_rdma_dev_t *dev, void *addr, size_t len, int access, const char *what,
                         kvp_rdma_mr_t **mr_p)
{
    kvp_rdma_mr_t *mr = calloc(1, sizeof(*mr));
    if (mr == NULL)
        return fail(ENOMEM, "out of memory");
    mr->mr = ibv_reg_mr(dev->pd, addr, len, access);
    if (mr->mr == NULL) {
        int rc =
            fail(errno, "%s: ibv_reg_mr(%p, %zu bytes, %s): %s%s", dev->info.name, addr, len, what,
                 strerror(errno), errno == ENOMEM ? " (memlock limit? see ulimit -l)" : "");
        free(mr);
        return rc;
    }
    mr->addr = addr;
    mr->len = len;
    mr->lkey = mr->mr->lkey;
    mr->rkey = mr->mr->rkey;
    *mr_p = mr;
    return 0;
}

int kvp_rdma_mr_reg(kvp_rdma_dev_t *dev, void *addr, size_t len, bool remote, kvp_rdma_mr_t **mr_p)
{
    int access = IBV_ACCESS_LOCAL_WRITE;
    if (remote)
        access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    return mr_reg_access(dev, addr, len, access, remote ? "remote read+write" : "local", mr_p);
}

int kvp_rdma_mr_reg_dmabuf(kvp_rdma_dev_t *dev, void *addr, size_t len, int fd, uint64_t offset,
                           bool remote, kvp_rdma_mr_t **mr_p)
{
    kvp_rdma_mr_t *mr = calloc(1, sizeof(*mr));
    if (mr == NULL)
        return fail(ENOMEM, "out of memory");
    int access = IBV_ACCESS_LOCAL_WRITE;
    if (remote)
        access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    mr->mr = ibv_reg_dmabuf_mr(dev->pd, offset, len, (uintptr_t)addr, fd, access);
    if (mr->mr == NULL) {
        int rc = fail(errno, "%s: ibv_reg_dmabuf_mr(fd %d, %zu bytes): %s", dev->info.name, fd, len,
                      strerror(errno));
        free(mr);
        return rc;
    }
    mr->addr = addr;
    mr->len = len;
    mr->lkey = mr->mr->lkey;
    mr->rkey = mr->mr->rkey;
    *mr_p = mr;
    return 0;
}

int kvp_rdma_mr_reg_windows(kvp_rdma_dev_t *dev, void *addr, size_t len, kvp_rdma_mr_t **mr_p)
{
    return mr_reg_access(dev, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND,
                         "window binding", mr_p);
}

struct kvp_rdma_mw {
    struct ibv_mw *mw;
    uint32_t rkey; /* since the last bind (libibverbs leaves a type 2 window's to us) */
};

int kvp_rdma_mw_alloc(kvp_rdma_dev_t *dev, kvp_rdma_mw_t **mw_p)
{
    kvp_rdma_mw_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return fail(ENOMEM, "out of memory");
    w->mw = ibv_alloc_mw(dev->pd, IBV_MW_TYPE_2);
    if (w->mw == NULL) {
        int rc = fail(errno ? errno : EOPNOTSUPP, "%s: ibv_alloc_mw(type 2): %s", dev->info.name,
                      strerror(errno ? errno : EOPNOTSUPP));
        free(w);
        return rc;
    }
    w->rkey = w->mw->rkey;
    *mw_p = w;
    return 0;
}

void kvp_rdma_mw_free(kvp_rdma_mw_t *mw)
{
    if (mw == NULL)
        return;
    if (ibv_dealloc_mw(mw->mw) != 0)
        fail(errno, "ibv_dealloc_mw: %s", strerror(errno));
    free(mw);
}

uint32_t kvp_rdma_mw_rkey(const kvp_rdma_mw_t *mw)
{
    return mw->rkey;
}

void kvp_rdma_mr_dereg(kvp_rdma_mr_t *mr)
{
    if (mr == NULL)
        return;
    if (ibv_dereg_mr(mr->mr) != 0)
        fail(errno, "ibv_dereg_mr: %s", strerror(errno));
    free(mr);
}

/* ------------------------------------------------------------ connections */

/* Wait for the next rdma_cm event on ch; the caller acks it. */
static int cm_next(struct rdma_event_channel *ch, int timeout_ms, struct rdma_cm_event **ev_p)
{
    struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
    int rc;
    do {
        rc = poll(&pfd, 1, timeout_ms);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0)
        return fail(errno, "poll on the rdma_cm channel: %s", strerror(errno));
    if (rc == 0)
        return fail(ETIMEDOUT, "no rdma_cm event within %d ms", timeout_ms);
    if (rdma_get_cm_event(ch, ev_p) != 0)
        return fail(errno, "rdma_get_cm_event: %s", strerror(errno));
    return 0;
}

/* Wait for `want` on a connector's own channel; copies the private data. */
static int cm_expect(kvp_rdma_qp_t *qp, enum rdma_cm_event_type want, int timeout_ms,
                     const char *step)
{
    struct rdma_cm_event *ev;
    int rc = cm_next(qp->own_ch, timeout_ms, &ev);
    if (rc != 0)
        return fail(-rc, "%s: %s", step, kvp_rdma_last_error());
    enum rdma_cm_event_type got = ev->event;
    int status = ev->status;
    if (got == want && want == RDMA_CM_EVENT_ESTABLISHED) {
        size_t len = ev->param.conn.private_data_len;
        if (len > sizeof(qp->peer_pdata))
            len = sizeof(qp->peer_pdata);
        if (ev->param.conn.private_data != NULL)
            memcpy(qp->peer_pdata, ev->param.conn.private_data, len);
        qp->peer_pdata_len = ev->param.conn.private_data != NULL ? len : 0;
    }
    rdma_ack_cm_event(ev);
    if (got != want)
        return fail(got == RDMA_CM_EVENT_REJECTED ? ECONNREFUSED : EHOSTUNREACH,
                    "%s: got rdma_cm event %s (status %d%s%s), wanted %s", step,
                    rdma_event_str(got), status, status < 0 ? ": " : "",
                    status < 0 ? strerror(-status) : "", rdma_event_str(want));
    return 0;
}

/* Create the RC QP on id (bound to dev's context) and enter it in the table. */
static int qp_create(kvp_rdma_dev_t *dev, struct rdma_cm_id *id, kvp_rdma_qp_t *qp)
{
    if (id->verbs != dev->ctx)
        return fail(ENODEV, "the route goes through device %s, not %s",
                    id->verbs ? ibv_get_device_name(id->verbs->device) : "(none)", dev->info.name);
    qp->dev = dev;
    qp->id = id;
    qp->depth = dev->qp_depth;
    qp->slots = calloc(qp->depth, sizeof(*qp->slots));
    if (qp->slots == NULL)
        return fail(ENOMEM, "out of memory");
    struct ibv_qp_init_attr a;
    memset(&a, 0, sizeof(a));
    a.send_cq = dev->cq;
    a.recv_cq = dev->cq;
    a.cap.max_send_wr = qp->depth;
    a.cap.max_recv_wr = 1;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = 0;
    if (rdma_create_qp(id, dev->pd, &a) != 0) {
        int rc = fail(errno, "%s: rdma_create_qp(depth %u): %s", dev->info.name, qp->depth,
                      strerror(errno));
        free(qp->slots);
        qp->slots = NULL;
        return rc;
    }
    qp->ibqp = id->qp;

    pthread_mutex_lock(&dev->lock);
    unsigned idx = 0;
    while (idx < dev->qps_cap && dev->qps[idx] != NULL)
        idx++;
    if (idx == dev->qps_cap && dev->qps_cap < MAX_QPS) {
        unsigned cap = dev->qps_cap ? dev->qps_cap * 2 : 16;
        if (cap > MAX_QPS)
            cap = MAX_QPS;
        kvp_rdma_qp_t **t = realloc(dev->qps, cap * sizeof(*t));
        if (t != NULL) {
            memset(t + dev->qps_cap, 0, (cap - dev->qps_cap) * sizeof(*t));
            dev->qps = t;
            dev->qps_cap = cap;
        }
    }
    if (idx >= dev->qps_cap) {
        pthread_mutex_unlock(&dev->lock);
        rdma_destroy_qp(id);
        free(qp->slots);
        qp->slots = NULL;
        return fail(ENOMEM, "%s: too many QPs", dev->info.name);
    }
    dev->qps[idx] = qp;
    qp->idx = idx;
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

static void conn_param_init(const kvp_rdma_dev_t *dev, struct rdma_conn_param *cp,
                            const void *pdata, size_t len)
{
    memset(cp, 0, sizeof(*cp));
    cp->responder_resources = dev->max_rd;
    cp->initiator_depth = dev->max_init_rd;
    cp->retry_count = 7;
    cp->rnr_retry_count = 7;
    cp->private_data = pdata;
    cp->private_data_len = (uint8_t)len;
}

int kvp_rdma_connect(kvp_rdma_dev_t *dev, const char *ipv4, uint16_t port, int timeout_ms,
                     const void *pdata, size_t pdata_len, kvp_rdma_qp_t **qp_p)
{
    struct sockaddr_in dst;
    int rc = parse_ipv4(ipv4, port, &dst);
    if (rc != 0)
        return rc;
    if (pdata_len > KVP_RDMA_CONNECT_PDATA_MAX)
        return fail(EINVAL, "connect private data is %zu bytes, at most %d", pdata_len,
                    KVP_RDMA_CONNECT_PDATA_MAX);
    kvp_rdma_qp_t *qp = calloc(1, sizeof(*qp));
    if (qp == NULL)
        return fail(ENOMEM, "out of memory");
    qp->own_ch = rdma_create_event_channel();
    if (qp->own_ch == NULL) {
        rc = fail(errno, "rdma_create_event_channel: %s", strerror(errno));
        goto err_free;
    }
    struct rdma_cm_id *id;
    if (rdma_create_id(qp->own_ch, &id, qp, RDMA_PS_TCP) != 0) {
        rc = fail(errno, "rdma_create_id: %s", strerror(errno));
        goto err_destroy_ch;
    }
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, timeout_ms) != 0) {
        rc = fail(errno, "rdma_resolve_addr(%s): %s", ipv4, strerror(errno));
        goto err_destroy_id;
    }
    rc = cm_expect(qp, RDMA_CM_EVENT_ADDR_RESOLVED, timeout_ms, "resolving the address");
    if (rc != 0)
        goto err_destroy_id;
    if (rdma_resolve_route(id, timeout_ms) != 0) {
        rc = fail(errno, "rdma_resolve_route(%s): %s%s", ipv4, strerror(errno),
                  errno == ENODEV ? " (a loopback address? use the RDMA netdev's own IP)" : "");
        goto err_destroy_id;
    }
    rc = cm_expect(qp, RDMA_CM_EVENT_ROUTE_RESOLVED, timeout_ms, "resolving the route");
    if (rc != 0)
        goto err_destroy_id;
    rc = qp_create(dev, id, qp);
    if (rc != 0)
        goto err_destroy_id;
    struct rdma_conn_param cp;
    conn_param_init(dev, &cp, pdata, pdata_len);
    if (rdma_connect(id, &cp) != 0) {
        rc = fail(errno, "rdma_connect(%s:%u): %s", ipv4, port, strerror(errno));
        goto err_destroy_qp;
    }
    rc = cm_expect(qp, RDMA_CM_EVENT_ESTABLISHED, timeout_ms, "connecting");
    if (rc != 0) {
        fail(-rc, "%s:%u: %s", ipv4, port, kvp_rdma_last_error());
        goto err_destroy_qp;
    }
    qp->connected = true;
    *qp_p = qp;
    return 0;

err_destroy_qp:
    pthread_mutex_lock(&dev->lock);
    dev->qps[qp->idx] = NULL;
    pthread_mutex_unlock(&dev->lock);
    rdma_destroy_qp(id);
    free(qp->slots);
err_destroy_id:
    rdma_destroy_id(id);
err_destroy_ch:
    rdma_destroy_event_channel(qp->own_ch);
err_free:
    free(qp);
    return rc;
}

int kvp_rdma_listen(kvp_rdma_dev_t *dev, const char *ipv4, uint16_t port, int backlog,
                    kvp_rdma_listener_t **lst_p, uint16_t *port_p)
{
    struct sockaddr_in sin;
    int rc = parse_ipv4(ipv4, port, &sin);
    if (rc != 0)
        return rc;
    kvp_rdma_listener_t *lst = calloc(1, sizeof(*lst));
    if (lst == NULL)
        return fail(ENOMEM, "out of memory");
    lst->dev = dev;
    lst->ch = rdma_create_event_channel();
    if (lst->ch == NULL) {
        rc = fail(errno, "rdma_create_event_channel: %s", strerror(errno));
        goto err_free;
    }
    if (rdma_create_id(lst->ch, &lst->id, lst, RDMA_PS_TCP) != 0) {
        rc = fail(errno, "rdma_create_id: %s", strerror(errno));
        goto err_destroy_ch;
    }
    if (rdma_bind_addr(lst->id, (struct sockaddr *)&sin) != 0) {
        rc = fail(errno, "rdma_bind_addr(%s:%u): %s", ipv4, port, strerror(errno));
        goto err_destroy_id;
    }
    if (lst->id->verbs != NULL && lst->id->verbs != dev->ctx) {
        rc = fail(ENODEV, "%s belongs to device %s, not %s", ipv4,
                  ibv_get_device_name(lst->id->verbs->device), dev->info.name);
        goto err_destroy_id;
    }
    if (rdma_listen(lst->id, backlog) != 0) {
        rc = fail(errno, "rdma_listen(%s:%u): %s", ipv4, port, strerror(errno));
        goto err_destroy_id;
    }
    if (port_p != NULL)
        *port_p = ntohs(rdma_get_src_port(lst->id));
    *lst_p = lst;
    return 0;

err_destroy_id:
    rdma_destroy_id(lst->id);
err_destroy_ch:
    rdma_destroy_event_channel(lst->ch);
err_free:
    free(lst);
    return rc;
}

int kvp_rdma_accept(kvp_rdma_listener_t *lst, int timeout_ms, const void *pdata, size_t pdata_len,
                    kvp_rdma_accept_check_fn check, void *check_arg, kvp_rdma_qp_t **qp_p)
{
    if (pdata_len > KVP_RDMA_ACCEPT_PDATA_MAX)
        return fail(EINVAL, "accept private data is %zu bytes, at most %d", pdata_len,
                    KVP_RDMA_ACCEPT_PDATA_MAX);
    for (;;) {
        struct rdma_cm_event *ev;
        int rc = cm_next(lst->ch, timeout_ms, &ev);
        if (rc != 0)
            return fail(-rc, "accept: %s", kvp_rdma_last_error());
        if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
            /* An event of a QP accepted earlier (its id's context). */
            kvp_rdma_qp_t *old = ev->id != lst->id ? ev->id->context : NULL;
            if (old != NULL &&
                (ev->event == RDMA_CM_EVENT_DISCONNECTED ||
                 ev->event == RDMA_CM_EVENT_CONNECT_ERROR ||
                 ev->event == RDMA_CM_EVENT_UNREACHABLE || ev->event == RDMA_CM_EVENT_REJECTED ||
                 ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT))
                atomic_store(&old->disconnected, true);
            rdma_ack_cm_event(ev);
            continue;
        }
        struct rdma_cm_id *id = ev->id;
        if (check != NULL &&
            check(check_arg, ev->param.conn.private_data,
                  ev->param.conn.private_data != NULL ? ev->param.conn.private_data_len : 0) != 0) {
            rdma_reject(id, NULL, 0);
            rdma_ack_cm_event(ev);
            rdma_destroy_id(id);
            return fail(EACCES, "a connection request was refused");
        }
        kvp_rdma_qp_t *qp = calloc(1, sizeof(*qp));
        if (qp == NULL) {
            rdma_reject(id, NULL, 0);
            rdma_ack_cm_event(ev);
            rdma_destroy_id(id);
            return fail(ENOMEM, "out of memory");
        }
        size_t len = ev->param.conn.private_data_len;
        if (len > sizeof(qp->peer_pdata))
            len = sizeof(qp->peer_pdata);
        if (ev->param.conn.private_data != NULL) {
            memcpy(qp->peer_pdata, ev->param.conn.private_data, len);
            qp->peer_pdata_len = len;
        }
        rdma_ack_cm_event(ev);
        id->context = qp;
        rc = qp_create(lst->dev, id, qp);
        if (rc != 0) {
            rdma_reject(id, NULL, 0);
            rdma_destroy_id(id);
            free(qp);
            return rc;
        }
        struct rdma_conn_param cp;
        conn_param_init(lst->dev, &cp, pdata, pdata_len);
        if (rdma_accept(id, &cp) != 0) {
            rc = fail(errno, "rdma_accept: %s", strerror(errno));
            pthread_mutex_lock(&lst->dev->lock);
            lst->dev->qps[qp->idx] = NULL;
            pthread_mutex_unlock(&lst->dev->lock);
            rdma_destroy_qp(id);
            rdma_destroy_id(id);
            free(qp->slots);
            free(qp);
            return rc;
        }
        /* ESTABLISHED arrives later on the listener's channel; the passive
         * side posts nothing, so it need not wait for it. */
        qp->connected = true;
        *qp_p = qp;
        return 0;
    }
}

void kvp_rdma_listener_destroy(kvp_rdma_listener_t *lst)
{
    if (lst == NULL)
        return;
    rdma_destroy_id(lst->id);
    rdma_destroy_event_channel(lst->ch);
    free(lst);
}

void kvp_rdma_qp_destroy(kvp_rdma_qp_t *qp)
{
    if (qp == NULL)
        return;
    kvp_rdma_dev_t *dev = qp->dev;
    if (qp->connected)
        rdma_disconnect(qp->id); /* best effort; the peer may be gone */
    pthread_mutex_lock(&dev->lock);
    dev->qps[qp->idx] = NULL;
    pthread_mutex_unlock(&dev->lock);
    rdma_destroy_qp(qp->id);
    rdma_destroy_id(qp->id);
    if (qp->own_ch != NULL)
        rdma_destroy_event_channel(qp->own_ch);
    free(qp->slots);
    free(qp);
}

const void *kvp_rdma_qp_peer_pdata(const kvp_rdma_qp_t *qp, size_t *len_p)
{
    *len_p = qp->peer_pdata_len;
    return qp->peer_pdata;
}

bool kvp_rdma_qp_in_error(const kvp_rdma_qp_t *qp)
{
    return atomic_load(&qp->error) || atomic_load(&qp->disconnected);
}

int kvp_rdma_qp_flush(kvp_rdma_qp_t *qp)
{
    atomic_store(&qp->error, true);
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
    int rc = ibv_modify_qp(qp->ibqp, &attr, IBV_QP_STATE);
    if (rc != 0)
        return fail(rc < 0 ? -rc : rc, "ibv_modify_qp(QP %u -> ERR): %s", qp->ibqp->qp_num,
                    strerror(rc < 0 ? -rc : rc));
    return 0;
}

void kvp_rdma_qp_poll_cm(kvp_rdma_qp_t *qp)
{
    if (qp->own_ch == NULL)
        return;
    struct rdma_cm_event *ev;
    struct pollfd pfd = {.fd = qp->own_ch->fd, .events = POLLIN};
    while (poll(&pfd, 1, 0) == 1 && rdma_get_cm_event(qp->own_ch, &ev) == 0) {
        if (ev->event == RDMA_CM_EVENT_DISCONNECTED || ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL ||
            ev->event == RDMA_CM_EVENT_TIMEWAIT_EXIT)
            atomic_store(&qp->disconnected, true);
        rdma_ack_cm_event(ev);
    }
}

const char *kvp_rdma_qp_state_str(kvp_rdma_qp_t *qp)
{
    static const char *const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    if (ibv_query_qp(qp->ibqp, &attr, IBV_QP_STATE, &init) != 0) {
        fail(errno, "ibv_query_qp: %s", strerror(errno));
        return NULL;
    }
    unsigned s = (unsigned)attr.qp_state;
    return s < sizeof(names) / sizeof(names[0]) ? names[s] : "UNKNOWN";
}

unsigned kvp_rdma_qp_inflight(const kvp_rdma_qp_t *qp)
{
    return (unsigned)(atomic_load(&qp->posted) - atomic_load(&qp->done));
}

/* ------------------------------------------------------------- data path */

int kvp_rdma_post_chain(kvp_rdma_qp_t *qp, kvp_rdma_op_t op, const kvp_rdma_wr_t *wrs, size_t n,
                        size_t *posted_p)
{
    size_t posted_dummy;
    if (posted_p == NULL)
        posted_p = &posted_dummy;
    *posted_p = 0;
    if (n == 0 || n > KVP_RDMA_MAX_CHAIN)
        return fail(EINVAL, "a chain has 1..%d WRs, not %zu", KVP_RDMA_MAX_CHAIN, n);
    if (op != KVP_RDMA_WRITE && op != KVP_RDMA_READ)
        return fail(EINVAL, "unknown rdma op %d", (int)op);
    if (kvp_rdma_qp_in_error(qp))
        return fail(ENOTCONN,
                    "QP %u is in error (disconnected or an error completion); "
                    "reconnect",
                    qp->ibqp->qp_num);
    uint64_t posted = atomic_load(&qp->posted);
    uint64_t done = atomic_load(&qp->done);
    if (posted - done + n > qp->depth)
        return fail(EAGAIN, "QP %u send queue full (%u in flight of %u)", qp->ibqp->qp_num,
                    (unsigned)(posted - done), qp->depth);

    struct ibv_send_wr w[KVP_RDMA_MAX_CHAIN];
    struct ibv_sge sge[KVP_RDMA_MAX_CHAIN];
    enum ibv_wr_opcode opcode = op == KVP_RDMA_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    for (size_t i = 0; i < n; i++) {
        uint64_t seq = posted + i;
        sge[i].addr = (uintptr_t)wrs[i].local;
        sge[i].length = wrs[i].len;
        sge[i].lkey = wrs[i].lkey;
        memset(&w[i], 0, sizeof(w[i]));
        w[i].wr_id = (uint64_t)qp->idx << SEQ_BITS | (seq & SEQ_MASK);
        w[i].next = i + 1 < n ? &w[i + 1] : NULL;
        w[i].sg_list = &sge[i];
        w[i].num_sge = 1;
        w[i].opcode = opcode;
        w[i].send_flags = i + 1 == n ? IBV_SEND_SIGNALED : 0;
        w[i].wr.rdma.remote_addr = wrs[i].remote;
        w[i].wr.rdma.rkey = wrs[i].rkey;
        wr_slot_t *slot = &qp->slots[seq % qp->depth];
        slot->wr_id = wrs[i].wr_id;
        slot->last = i + 1 == n;
    }
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(qp->ibqp, w, &bad);
    if (rc == 0) {
        atomic_store(&qp->posted, posted + n);
        *posted_p = n;
        return 0;
    }
    if (rc < 0)
        rc = -rc;
    size_t k = bad != NULL ? (size_t)(bad - w) : 0;
    if (k > 0 && k < n) {
        /* Part of the chain went out unsignaled: make its last WR the chain
         * end and flush the QP so those WRs complete and are accounted. */
        qp->slots[(posted + k - 1) % qp->depth].last = true;
        atomic_store(&qp->posted, posted + k);
        *posted_p = k;
        atomic_store(&qp->error, true);
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
        ibv_modify_qp(qp->ibqp, &attr, IBV_QP_STATE);
    }
    return fail(rc, "ibv_post_send(QP %u, %zu WRs, failed at %zu): %s", qp->ibqp->qp_num, n, k,
                strerror(rc));
}

int kvp_rdma_post_windows(kvp_rdma_qp_t *qp, kvp_rdma_mr_t *mr, const kvp_rdma_mw_wr_t *wrs,
                          size_t n, uint64_t wr_id, size_t *posted_p)
{
    size_t posted_dummy;
    if (posted_p == NULL)
        posted_p = &posted_dummy;
    *posted_p = 0;
    if (n == 0 || n > KVP_RDMA_MAX_CHAIN)
        return fail(EINVAL, "a chain has 1..%d WRs, not %zu", KVP_RDMA_MAX_CHAIN, n);
    if (kvp_rdma_qp_in_error(qp))
        return fail(ENOTCONN, "QP %u is in error; reconnect", qp->ibqp->qp_num);
    uint64_t posted = atomic_load(&qp->posted);
    uint64_t done = atomic_load(&qp->done);
    if (posted - done + n > qp->depth)
        return fail(EAGAIN, "QP %u send queue full (%u in flight of %u)", qp->ibqp->qp_num,
                    (unsigned)(posted - done), qp->depth);
    struct ibv_send_wr w[KVP_RDMA_MAX_CHAIN];
    uint32_t rkeys[KVP_RDMA_MAX_CHAIN];
    for (size_t i = 0; i < n; i++) {
        uint64_t seq = posted + i;
        memset(&w[i], 0, sizeof(w[i]));
        w[i].wr_id = (uint64_t)qp->idx << SEQ_BITS | (seq & SEQ_MASK);
        w[i].next = i + 1 < n ? &w[i + 1] : NULL;
        w[i].send_flags = i + 1 == n ? IBV_SEND_SIGNALED : 0;
        if (wrs[i].len == 0) {
            w[i].opcode = IBV_WR_LOCAL_INV;
            w[i].invalidate_rkey = wrs[i].mw->rkey;
            rkeys[i] = wrs[i].mw->rkey;
        } else {
            rkeys[i] = ibv_inc_rkey(wrs[i].mw->rkey);
            w[i].opcode = IBV_WR_BIND_MW;
            w[i].bind_mw.mw = wrs[i].mw->mw;
            w[i].bind_mw.rkey = rkeys[i];
            w[i].bind_mw.bind_info = (struct ibv_mw_bind_info){
                .mr = mr->mr,
                .addr = wrs[i].addr,
                .length = wrs[i].len,
                .mw_access_flags = wrs[i].write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ};
        }
        wr_slot_t *slot = &qp->slots[seq % qp->depth];
        slot->wr_id = wr_id;
        slot->last = i + 1 == n;
    }
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(qp->ibqp, w, &bad);
    size_t k = rc == 0 ? n : bad != NULL ? (size_t)(bad - w) : 0;
    for (size_t i = 0; i < k; i++) /* the provider names a window by ibv_mw.rkey: ours to move */
        wrs[i].mw->rkey = wrs[i].mw->mw->rkey = rkeys[i];
    if (rc == 0) {
        atomic_store(&qp->posted, posted + n);
        *posted_p = n;
        return 0;
    }
    if (rc < 0)
        rc = -rc;
    if (k > 0 && k < n) { /* as kvp_rdma_post_chain: the first k are a chain of their own */
        qp->slots[(posted + k - 1) % qp->depth].last = true;
        atomic_store(&qp->posted, posted + k);
        *posted_p = k;
        atomic_store(&qp->error, true);
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
        ibv_modify_qp(qp->ibqp, &attr, IBV_QP_STATE);
    }
    return fail(rc, "ibv_post_send(QP %u, %zu window WRs, failed at %zu): %s", qp->ibqp->qp_num, n,
                k, strerror(rc));
}

uint32_t kvp_rdma_qp_num(const kvp_rdma_qp_t *qp)
{
    return qp->ibqp->qp_num;
}

uint32_t kvp_rdma_qp_remote_num(kvp_rdma_qp_t *qp)
{
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    memset(&attr, 0, sizeof(attr));
    if (ibv_query_qp(qp->ibqp, &attr, IBV_QP_DEST_QPN, &init) != 0)
        return 0;
    return attr.dest_qp_num;
}

int kvp_rdma_poll(kvp_rdma_dev_t *dev, kvp_rdma_wc_t *wcs, int max)
{
    struct ibv_wc ib[POLL_BATCH];
    int total = 0;
    while (total < max) {
        int want = max - total < POLL_BATCH ? max - total : POLL_BATCH;
        int n = ibv_poll_cq(dev->cq, want, ib);
        if (n < 0)
            return fail(EIO, "%s: ibv_poll_cq failed (%d)", dev->info.name, n);
        if (n == 0)
            break;
        pthread_mutex_lock(&dev->lock);
        for (int i = 0; i < n; i++) {
            unsigned idx = (unsigned)(ib[i].wr_id >> SEQ_BITS);
            uint64_t seq = ib[i].wr_id & SEQ_MASK;
            kvp_rdma_qp_t *qp = idx < dev->qps_cap ? dev->qps[idx] : NULL;
            if (qp == NULL || qp->ibqp->qp_num != ib[i].qp_num)
                continue; /* a destroyed QP's leftover */
            wr_slot_t *slot = &qp->slots[seq % qp->depth];
            kvp_rdma_wc_t *out = &wcs[total++];
            out->wr_id = slot->wr_id;
            out->qp = qp;
            out->ibv_status = (int)ib[i].status;
            out->status = map_wc_status(ib[i].status);
            out->chain_end = slot->last;
            if (ib[i].status != IBV_WC_SUCCESS)
                atomic_store(&qp->error, true);
            if (slot->last)
                atomic_store(&qp->done, seq + 1);
        }
        pthread_mutex_unlock(&dev->lock);
        if (n < want)
            break;
    }
    return total;
}

int kvp_rdma_wait(kvp_rdma_dev_t *dev, kvp_rdma_wc_t *wcs, int max, int timeout_ms)
{
    int n = kvp_rdma_poll(dev, wcs, max);
    if (n != 0)
        return n;
    if (ibv_req_notify_cq(dev->cq, 0) != 0)
        return fail(errno, "%s: ibv_req_notify_cq: %s", dev->info.name, strerror(errno));
    /* A completion may have landed between the poll and the arming. */
    n = kvp_rdma_poll(dev, wcs, max);
    if (n != 0)
        return n;
    struct pollfd pfd = {.fd = dev->ch->fd, .events = POLLIN};
    int rc = poll(&pfd, 1, timeout_ms);
    if (rc < 0 && errno != EINTR)
        return fail(errno, "poll on the completion channel: %s", strerror(errno));
    if (rc <= 0)
        return 0;
    struct ibv_cq *cq;
    void *cq_ctx;
    if (ibv_get_cq_event(dev->ch, &cq, &cq_ctx) != 0)
        return fail(errno, "%s: ibv_get_cq_event: %s", dev->info.name, strerror(errno));
    ibv_ack_cq_events(cq, 1);
    return kvp_rdma_poll(dev, wcs, max);
}
