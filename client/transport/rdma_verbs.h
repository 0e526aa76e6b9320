/*
 * rdma_verbs.h - a small RDMA verbs layer (libibverbs + librdmacm) for the
 * rdma transport. It knows nothing of kvpool's client: devices, memory
 * regions, RC QPs connected through rdma_cm, chains of one-sided RDMA
 * WRITE/READ work requests, and completions mapped to a small status enum.
 *
 * Design:
 *   - One kvp_rdma_dev_t per device: its verbs context (the one librdmacm
 *     uses, so rdma_cm ids and our PD/CQ match), one PD, one CQ with a
 *     completion channel shared by every QP of the device.
 *   - A chain of n WRs is posted with ONE ibv_post_send; only the last WR is
 *     signaled. On success the caller sees one completion (chain_end). On
 *     error the failing WR is reported with its own wr_id, then the rest of
 *     the chain is flushed; the last WR's completion is always chain_end, so
 *     "chain done" is always seen exactly once.
 *   - Bounded in-flight work: a QP accepts a chain only while its posted but
 *     uncompleted WRs fit in its send queue (else -EAGAIN).
 *   - A QP that saw an error completion is in error: posting fails with
 *     -ENOTCONN; the caller destroys it and connects again.
 *
 * Errors: functions return 0 or a negative errno and never abort; the text
 * of the last error of the calling thread (with the ibv/rdma_cm call and its
 * errno text) is kvp_rdma_last_error().
 *
 * Threads: dev open/close, listen, accept, connect and qp destroy may run on
 * any thread; post_chain on one thread per QP at a time; poll/wait on one
 * thread per device (the completion thread). A QP is destroyed only when no
 * work is in flight on it.
 */
#ifndef KVP_CLIENT_RDMA_VERBS_H
#define KVP_CLIENT_RDMA_VERBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ibv_mr;

typedef struct kvp_rdma_dev kvp_rdma_dev_t;
typedef struct kvp_rdma_qp kvp_rdma_qp_t;
typedef struct kvp_rdma_listener kvp_rdma_listener_t;

/* The most WRs in one chain (one ibv_post_send). */
#define KVP_RDMA_MAX_CHAIN 64
/* Most private data bytes that connect (REQ) and accept (REP) can carry. */
#define KVP_RDMA_CONNECT_PDATA_MAX 56
#define KVP_RDMA_ACCEPT_PDATA_MAX 196

typedef struct kvp_rdma_dev_params {
    /* Comma-separated device names to try in order; NULL, "" or "auto": all. */
    const char *device_names;
    /* IPv4 address (dotted) that must have a RoCE v2 GID on the chosen port;
     * NULL: any ACTIVE port. */
    const char *ipv4;
    unsigned cq_depth; /* 0: 1024 */
    unsigned qp_depth; /* send queue WRs per QP; 0: 128 */
} kvp_rdma_dev_params_t;

typedef struct kvp_rdma_dev_info {
    char name[64];
    uint8_t port;
    int gid_index;       /* RoCE v2 GID of params.ipv4; -1 when not asked */
    unsigned active_mtu; /* bytes */
    bool roce;           /* link layer Ethernet */
} kvp_rdma_dev_info_t;

typedef struct kvp_rdma_mr {
    void *addr;
    size_t len;
    uint32_t lkey;
    uint32_t rkey; /* meaningful when registered with remote access */
    struct ibv_mr *mr;
} kvp_rdma_mr_t;

typedef enum kvp_rdma_op {
    KVP_RDMA_WRITE = 1, /* local -> remote */
    KVP_RDMA_READ = 2,  /* remote -> local */
} kvp_rdma_op_t;

/* One WR of a chain. len > 0. */
typedef struct kvp_rdma_wr {
    void *local;
    uint32_t lkey;
    uint32_t len;
    uint64_t remote;
    uint32_t rkey;
    uint64_t wr_id; /* the caller's, returned in the completion */
} kvp_rdma_wr_t;

typedef enum kvp_rdma_wc_status {
    KVP_RDMA_WC_OK = 0,
    KVP_RDMA_WC_REMOTE_ACCESS,  /* bad rkey, out of bounds, no permission */
    KVP_RDMA_WC_RETRY_EXCEEDED, /* peer unreachable or gone (transport/RNR retries) */
    KVP_RDMA_WC_FLUSHED,        /* QP in error; the WR was never executed */
    KVP_RDMA_WC_OTHER,
} kvp_rdma_wc_status_t;

typedef struct kvp_rdma_wc {
    uint64_t wr_id; /* the caller's wr_id of this WR */
    kvp_rdma_qp_t *qp;
    kvp_rdma_wc_status_t status;
    int ibv_status; /* enum ibv_wc_status, for logs */
    bool chain_end; /* last WR of its chain: the whole chain is finished */
} kvp_rdma_wc_t;

/* Text of the calling thread's last error (never NULL). */
const char *kvp_rdma_last_error(void);
const char *kvp_rdma_wc_status_str(kvp_rdma_wc_status_t status);

/* Open a usable device: a port ACTIVE and, when params->ipv4 is set, a RoCE
 * v2 GID for it. -ENODEV (with a message listing what was tried) if none. */
int kvp_rdma_dev_open(const kvp_rdma_dev_params_t *params, kvp_rdma_dev_t **dev_p);
/* Every QP, listener and MR of the device must be gone. */
void kvp_rdma_dev_close(kvp_rdma_dev_t *dev);
const kvp_rdma_dev_info_t *kvp_rdma_dev_info(const kvp_rdma_dev_t *dev);
/* The IPv4 address (dotted, into buf) of the first RoCE v2 GID of the
 * device's port: the address rdma_cm peers reach it at. -ENOENT if none
 * (InfiniBand, or no IPv4 on the netdev). */
int kvp_rdma_dev_ipv4(const kvp_rdma_dev_t *dev, char *buf, size_t len);
/* Drain the device's asynchronous events without waiting; returns how many of them said a
 * QP saw a remote access error (IBV_EVENT_QP_ACCESS_ERR: a peer used a bad rkey, address
 * or permission on it), or a negative errno. */
int kvp_rdma_dev_access_errors(kvp_rdma_dev_t *dev);
/* The device's own count of remote access errors it answered as a responder, from its
 * hw_counters in sysfs (mlx5: resp_remote_access_errors); -1: the device has none (rxe). */
int64_t kvp_rdma_dev_nic_access_errors(const kvp_rdma_dev_t *dev);
/* The CQ's depth: the most completions it can hold. */
unsigned kvp_rdma_dev_cq_depth(const kvp_rdma_dev_t *dev);
/* fd of the completion channel (readable when kvp_rdma_wait would wake). */
int kvp_rdma_dev_fd(const kvp_rdma_dev_t *dev);

/* Register [addr, addr+len): local write always (READ lands there); remote
 * READ+WRITE too when `remote`. The memory stays the caller's. */
int kvp_rdma_mr_reg(kvp_rdma_dev_t *dev, void *addr, size_t len, bool remote, kvp_rdma_mr_t **mr_p);
/* Register device memory exported as a dma-buf (fd, offset of addr in it);
 * addr is the address WRs use for it. */
int kvp_rdma_mr_reg_dmabuf(kvp_rdma_dev_t *dev, void *addr, size_t len, int fd, uint64_t offset,
                           bool remote, kvp_rdma_mr_t **mr_p);
void kvp_rdma_mr_dereg(kvp_rdma_mr_t *mr);

/* Register [addr, addr+len) for local write and memory-window binding only: its own rkey
 * opens nothing remotely; peers reach it through type 2 windows bound on their queue pairs
 * (kvp_rdma_post_windows). */
int kvp_rdma_mr_reg_windows(kvp_rdma_dev_t *dev, void *addr, size_t len, kvp_rdma_mr_t **mr_p);

/*
 * Memory windows, type 2: allocated free, bound by a work request on one QP to an extent of a
 * window-bindable MR with remote READ or WRITE (only that QP's peer can then use the rkey,
 * only on that extent), invalidated by another work request on the same QP. Each bind gives
 * the window a new rkey (its key byte moves on).
 */
typedef struct kvp_rdma_mw kvp_rdma_mw_t;
int kvp_rdma_mw_alloc(kvp_rdma_dev_t *dev, kvp_rdma_mw_t **mw_p);
/* Bound or not; its QP's reference goes with it. */
void kvp_rdma_mw_free(kvp_rdma_mw_t *mw);
/* The window's rkey since its last bind. */
uint32_t kvp_rdma_mw_rkey(const kvp_rdma_mw_t *mw);

typedef struct kvp_rdma_mw_wr {
    kvp_rdma_mw_t *mw;
    uint64_t addr; /* bind: the extent (inside mr); len 0: invalidate the window instead */
    uint64_t len;
    bool write; /* bind: remote WRITE, else remote READ */
} kvp_rdma_mw_wr_t;

/* Post n (1..KVP_RDMA_MAX_CHAIN) binds / invalidations as one chain on qp, the last signaled;
 * every WR's completion carries wr_id (the chain's end: chain_end). Errors as
 * kvp_rdma_post_chain's. */
int kvp_rdma_post_windows(kvp_rdma_qp_t *qp, kvp_rdma_mr_t *mr, const kvp_rdma_mw_wr_t *wrs,
                          size_t n, uint64_t wr_id, size_t *posted_p);
/* The QP's number on this device, and the number of the QP it is connected to (0: unknown). */
uint32_t kvp_rdma_qp_num(const kvp_rdma_qp_t *qp);
uint32_t kvp_rdma_qp_remote_num(kvp_rdma_qp_t *qp);

/* Listen on ipv4:port (port 0: any; the bound port goes to *port_p). */
int kvp_rdma_listen(kvp_rdma_dev_t *dev, const char *ipv4, uint16_t port, int backlog,
                    kvp_rdma_listener_t **lst_p, uint16_t *port_p);
/* A gate on connection requests: 0 to accept one whose private data is pdata[0..len), else
 * it is rejected (no QP is made). */
typedef int (*kvp_rdma_accept_check_fn)(void *arg, const void *pdata, size_t len);

/* Wait up to timeout_ms (-1: forever) for a connection request, accept it
 * with `pdata` (may be NULL) and return the established QP. Connection
 * requests carry the connector's pdata: kvp_rdma_qp_peer_pdata(). check
 * (NULL: none) sees each request's pdata first; a request it refuses is
 * rejected and -EACCES returned. */
int kvp_rdma_accept(kvp_rdma_listener_t *lst, int timeout_ms, const void *pdata, size_t pdata_len,
                    kvp_rdma_accept_check_fn check, void *check_arg, kvp_rdma_qp_t **qp_p);
/* QPs accepted from the listener must be destroyed first. */
void kvp_rdma_listener_destroy(kvp_rdma_listener_t *lst);

/* Connect an RC QP to ipv4:port within timeout_ms (each rdma_cm step). */
int kvp_rdma_connect(kvp_rdma_dev_t *dev, const char *ipv4, uint16_t port, int timeout_ms,
                     const void *pdata, size_t pdata_len, kvp_rdma_qp_t **qp_p);
/* Disconnect and free. No work may be in flight (poll until chain_end). */
void kvp_rdma_qp_destroy(kvp_rdma_qp_t *qp);
/* The private data the peer sent with its connect / accept. */
const void *kvp_rdma_qp_peer_pdata(const kvp_rdma_qp_t *qp, size_t *len_p);
/* True after an error completion on this QP (it must be reconnected). */
bool kvp_rdma_qp_in_error(const kvp_rdma_qp_t *qp);
/* Move the QP to the error state: the device executes nothing more of it
 * and completes everything in flight as flushed. Used when a peer stops
 * answering, so the caller's buffers are never touched after it gives up. */
int kvp_rdma_qp_flush(kvp_rdma_qp_t *qp);
/* Connector side: consume the QP's pending rdma_cm events without waiting
 * (a DISCONNECTED marks it in error). Accepted QPs' events are consumed by
 * kvp_rdma_accept. Call from the thread that posts on the QP. */
void kvp_rdma_qp_poll_cm(kvp_rdma_qp_t *qp);
/* The QP's state as the device sees it ("RTS", "ERR", ...), or NULL. */
const char *kvp_rdma_qp_state_str(kvp_rdma_qp_t *qp);
/* WRs posted and not yet completed. */
unsigned kvp_rdma_qp_inflight(const kvp_rdma_qp_t *qp);

/* Post n (1..KVP_RDMA_MAX_CHAIN) WRs of one op as one chain, one doorbell,
 * last WR signaled. -EAGAIN: the send queue has no room (poll first);
 * -ENOTCONN: the QP is in error; other: ibv_post_send failed. *posted_p
 * (may be NULL) receives how many WRs went out: n on success, 0 on most
 * failures, k in 1..n-1 when the device took only the first k: those k
 * then form a chain of their own (WR k-1 is its end) and are flushed, so
 * they still complete. */
int kvp_rdma_post_chain(kvp_rdma_qp_t *qp, kvp_rdma_op_t op, const kvp_rdma_wr_t *wrs, size_t n,
                        size_t *posted_p);

/* Non-blocking: up to max completions into wcs. Returns the count (>= 0) or
 * a negative errno. */
int kvp_rdma_poll(kvp_rdma_dev_t *dev, kvp_rdma_wc_t *wcs, int max);
/* Like kvp_rdma_poll, but sleeps on the completion channel up to timeout_ms
 * (-1: forever) when the CQ is empty. 0: timed out. */
int kvp_rdma_wait(kvp_rdma_dev_t *dev, kvp_rdma_wc_t *wcs, int max, int timeout_ms);

#endif
