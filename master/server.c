/*
 * server.c - the master's epoll loop: accept, read frames, dispatch, write.
 *
 * One thread owns everything (STYLE.md, Threads): connections, buffers and
 * all metadata behind kvp_dispatch_handle. Sockets are non-blocking; a
 * connection's input is scanned for whole frames (bounded by
 * KVP_RPC_MAX_BODY, checked from the header before any allocation) and its
 * replies are queued in an output buffer flushed as the socket allows. A
 * peer that sends a bad frame gets an error reply (when it speaks our
 * magic) and is closed. A peer that stops reading its replies is read no
 * more (EPOLLIN off) once OUT_PAUSE bytes are queued for it, or any with
 * replies queued once --max-output-buffers are queued for all, until they
 * are read; a queue past KVP_MASTER_MAX_OUTBUF (a record stream's pushes)
 * closes it. Each connection's turn handles at most TURN_FRAMES frames or
 * TURN_NS of work, then the others get theirs (what it sent besides waits,
 * held, for its next turn), so no peer holds the loop however much it
 * pipelines. With an ACL that budget is a principal's, not a connection's: the
 * connections of one principal share one TURN_FRAMES and TURN_NS per loop turn (served in
 * their order from the held list; those left over wait, ON_WAIT, and go first at the next
 * turn), so a principal that opens many connections gets no more of the loop than with
 * one, while TLS handshakes and the unauthenticated progress at every loop turn.
 * Either way every other connection is unaffected. SIGTERM/SIGINT arrive on a signalfd
 * and end the loop (SIGHUP reloads the credentials); everything is freed on the way out.
 *
 * What a peer may hold (docs/security.md, "Admission limits"): connections in
 * all, per peer address, per principal and before authentication are capped
 * (master/auth/admission.c decides, at the accept, before any TLS state is
 * made); an accept that fails for want of descriptors closes the pending
 * connection through a reserved descriptor, or stops watching the listener
 * for LISTEN_PAUSE_MS, never spins. A connection must authenticate within
 * --auth-timeout of its accept and finish each frame within --frame-timeout
 * of its first byte, whatever it trickles meanwhile; --client-ttl counts
 * from the last whole frame. An input buffer grows with what has arrived,
 * never past the frame its header announces, and the buffers past their
 * first READ_CHUNK stay under --max-input-buffers all together.
 *
 * What the loop asks of others: who is calling and may it send this
 * (master/auth/: admission, audit, credentials), whether this master may
 * serve now (master/ha/leadership.c), which segments' record changes to
 * write (master/meta/record.c, kvp_record_push), and the views it hands to
 * master/obs/ (the method table's names, the handlers' path, the KV event
 * sink for the state).
 */
#include "master/server.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/rpc.h"
#include "common/macros.h"
#include "common/clock.h"
#include "common/sock.h"
#include "common/parse.h"
#include "common/tls.h"
#include "master/auth/admission.h"
#include "master/auth/audit.h"
#include "master/auth/credentials.h"
#include "master/auth/mount_proof.h"
#include "master/dispatch.h"
#include "master/ha/leadership.h"
#include "master/ha/quota_store.h"
#include "master/rpc/object_calls.h"
#include "master/rpc/segment_calls.h"
#include "master/policy/copy_tasks.h"
#include "master/policy/hot_keys.h"
#include "master/policy/eviction.h"
#include "master/meta/record.h"
#include "master/policy/lease.h"
#include "master/obs/events.h"
#include "master/obs/http_views.h"
#include "kvpool.pb-c.h"

#define KVP_MASTER_MAX_OUTBUF (256u << 20)
#define READ_CHUNK (256u << 10)
/* Bytes one connection's read may take before the loop turns to the others: a peer sending
 * a 64 MiB frame as fast as it can gets it read (and decrypted) in slices, between which
 * every other connection is served. */
#define READ_BUDGET (1u << 20)
#define TICK_MS 500
/* Accept failing for want of memory or descriptors (and none reserved to close the pending
 * connection with): the listener is not watched for this long. */
#define LISTEN_PAUSE_MS 100
/* Descriptors kept for what the master opens besides connections (HTTP, etcd, files that
 * are reloaded, the reserve): at most this, and at most a quarter of RLIMIT_NOFILE. */
#define FD_RESERVE 64u

/* The lists a connection can be on: every connection (shutdown, liveness), those held at
 * their last turn in the order they are to be served (serve_held), those held whose
 * principal had its share of this loop turn (served first at the next: serve_held), those
 * whose replies wait for record streams (record gates). One pair of links each, appended
 * at the tail. */
enum { ON_ALL, ON_HELD, ON_WAIT, ON_GATED, N_LISTS };

typedef struct conn {
    int fd;
    uint64_t id;
    uint8_t *in;
    size_t in_len, in_cap;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    bool want_out;       /* EPOLLOUT armed */
    bool out_paused;     /* EPOLLIN off, requests not read: its replies are not read (out_full) */
    bool held;           /* its turn ended with input left: served again next turn (serve_held) */
    bool waiting;        /* held, on ON_WAIT: its principal's share of the turn was spent */
    bool again;          /* the first frame in `in` is a keys batch under way: called again
                          * at its next turn (st->call_again), not timed as a frame begun */
    uint64_t turn;       /* the loop's turn it was last served in */
    bool close_after;    /* close once the output queue is flushed */
    bool refuse;         /* protected mode, a peer of another host: refused at its first header */
    kvp_ssl_t *ssl;      /* TLS (--tls-cert): every byte goes through it; NULL: plain */
    kvp_caller_t caller; /* who is calling (master/auth/admission.h) */
    uint64_t last_rx_ms; /* when a whole frame last arrived: liveness for --client-ttl */
    uint64_t frame_start_ms; /* when the first byte of the frame in `in` arrived (0: none) */
    /* its links on the server's lists (srv->lists: ON_ALL, ON_HELD, ON_WAIT, ON_GATED) */
    struct conn *link_next[N_LISTS], *link_prev[N_LISTS];
    uint64_t sent_total; /* bytes of its output the socket ever took (a record stream's: gates) */
    uint64_t stream_seg; /* it carries this segment's record changes (SegRecord; 0: none):
                          * never gated */
    bool doomed;         /* to be closed at the end of this turn (close_doomed) */
    uint64_t sent_seen;  /* sent_total at the last --client-ttl check (a stream's liveness) */
    bool adopted;        /* this turn ran an Adopt: not gated (gate_turn) */
    /* record gates: its replies wait for these streams to take what was queued on them */
    struct gate *gates;
    unsigned n_gates, gates_cap;
    uint64_t gated_ms; /* since when (--record-wait) */
} conn_t;

/* A connection's replies wait until `stream` (a DRAM segment's SegRecord stream) has taken
 * pos bytes in all (sent_total). */
typedef struct gate {
    conn_t *stream; /* NULL: it closed */
    uint64_t seg_id;
    uint64_t pos;
} gate_t;

/* A request held without an answer (SsdTasks with no task yet: a long poll; a Mount whose
 * endpoint is being proven: proof_id). */
typedef struct parked {
    struct parked *next;
    uint64_t conn_id;
    uint64_t req_id;
    uint64_t deadline_ms; /* answer by then, even with nothing */
    uint64_t proof_id;    /* a Mount waiting for its proof (auth/mount_proof.h); 0: none */
    int proof;            /* ... its result: 0 not yet, 1 proven, -1 not (why) */
    char why[400];
    uint16_t method;
    size_t len;
    uint8_t body[];
} parked_t;

/* How long a held request waits at most (the tick answers it: up to TICK_MS later). */
#define PARK_MS 1000
/* Mount proofs (auth/mount_proof.h): probes run at once at most, of them for one principal
 * (its black holes hold no more workers than that), the others wait in a queue of
 * PROOF_QUEUE (past it a mount is refused, to be tried again); a Mount waits this long
 * for its probe's result at most (it comes within --mount-proof-timeout of its start). */
#define PROOF_THREADS 16
#define PROOF_PER_PRINCIPAL 8
#define PROOF_QUEUE 4096
#define PROOF_WAIT_MS 30000

struct kvp_master_server {
    int epfd;
    int listen_fd;
    int sig_fd;
    uint64_t next_conn_id;
    struct conn_list {
        conn_t *head, *tail;
    } lists[N_LISTS]; /* ON_ALL, ON_HELD, ON_WAIT, ON_GATED */
    unsigned n_conns;
    kvp_master_state_t state;
    parked_t *parked;
    kvp_prover_t *prover; /* --mount-proof on (epoll marker: &prover); NULL: off */
    uint64_t next_proof;
    bool proofs_ready; /* a held Mount has its proof's result: answer_proofs */
    bool stop;
    kvp_leadership_t ha; /* high availability (master/ha/): standalone until elect */
    /* HA: the tenant quota admin API's policies in etcd (NULL: standalone) */
    kvp_quota_store_t *quotas;
    /* operations (master/obs/) */
    kvp_master_http_t *http; /* NULL: --http-listen off (or its default was taken) */
    int http_fd;             /* its eventfd (epoll marker: &http_fd) */
    kvp_events_t *events;    /* NULL: no --kv-events-bind */
    kvp_rpc_hist_t hist[KVP_RPC_METHOD_MAX + 1];
    const char *method_names[KVP_RPC_METHOD_MAX + 1]; /* the method table's, for the views */
    kvp_credentials_t cred; /* TLS and ACL (master/auth/): NULL without --tls-cert; SIGHUP
                               reloads both */
    /* admission limits (master/auth/admission.h) */
    kvp_admission_limits_t limits;
    int reserve_fd;            /* /dev/null, closed to accept-and-close at EMFILE (-1: none) */
    uint64_t listen_paused_ms; /* the listener is not watched until then (0: it is) */
    uint64_t in_extra;         /* input buffers past READ_CHUNK, all connections together */
    uint64_t out_queued;       /* replies queued and not written, all connections together */
    uint64_t turn;             /* the loop's turns, counted */
    unsigned n_held;           /* connections held (input left over from their turn), waiting
                                * ones included */
    unsigned n_doomed;         /* connections to be closed at the end of the turn */
    bool closing_all;          /* close_all is closing every connection */
    uint64_t *turn_dirty;      /* segments a turn changed (scratch, kept) */
    size_t turn_dirty_cap;
};

/* What one connection's turn may take of the loop (frames handled, time): then the others
 * get theirs, and what is left of its input waits, held, for its next turn. With an ACL
 * this is what all the connections of one principal take of one loop turn together
 * (turn_start): the rest of them wait for the next, served first then (ON_WAIT). */
#define TURN_FRAMES 64u
#define TURN_NS (5ull * 1000000ull)
/* Replies queued for one connection past which the master reads no more of its requests
 * until the peer reads them (and, past --max-output-buffers for all, any with replies
 * queued): a peer that sends and never reads holds at most this plus one reply. */
#define OUT_PAUSE (4u << 20)

typedef struct turn {
    uint64_t end_ns;
    unsigned frames, max_frames;
    size_t bytes; /* read in this turn (READ_BUDGET) */
} turn_t;

static bool turn_over(const turn_t *t)
{
    return t->frames >= t->max_frames || kvp_now_ns() >= t->end_ns;
}

static size_t out_backlog(const conn_t *c)
{
    return c->out_len - c->out_off;
}

/* c's peer is not reading its replies (or the replies queued for all are over the cap and
 * c has some): read no more of its requests until they drain. */
static bool out_full(const kvp_master_server_t *srv, const conn_t *c)
{
    uint64_t max = srv->state.config.max_output_bytes;
    return out_backlog(c) >= OUT_PAUSE || (max != 0 && srv->out_queued > max && out_backlog(c) > 0);
}

static void list_unlink(kvp_master_server_t *srv, int l, conn_t *c)
{
    struct conn_list *list = &srv->lists[l];
    conn_t *next = c->link_next[l], *prev = c->link_prev[l];
    if (prev != NULL)
        prev->link_next[l] = next;
    else
        list->head = next;
    if (next != NULL)
        next->link_prev[l] = prev;
    else
        list->tail = prev;
    c->link_next[l] = c->link_prev[l] = NULL;
}

static void list_append(kvp_master_server_t *srv, int l, conn_t *c)
{
    struct conn_list *list = &srv->lists[l];
    c->link_prev[l] = list->tail;
    c->link_next[l] = NULL;
    if (list->tail != NULL)
        list->tail->link_next[l] = c;
    else
        list->head = c;
    list->tail = c;
}

/* Hold c (its turn ended with input left: serve_held gives it the next) or let it go. */
static void hold(kvp_master_server_t *srv, conn_t *c, bool on)
{
    if (c->held == on)
        return;
    c->held = on;
    if (on) {
        list_append(srv, ON_HELD, c);
        srv->n_held++;
    } else {
        list_unlink(srv, c->waiting ? ON_WAIT : ON_HELD, c);
        c->waiting = false;
        srv->n_held--;
    }
}

/* c's principal had its share of this loop turn: c waits, held, on ON_WAIT, whose
 * connections serve_held serves first at the next turn, in the order they came. */
static void wait_turn(kvp_master_server_t *srv, conn_t *c)
{
    if (c->waiting)
        return;
    if (c->held) {
        list_unlink(srv, ON_HELD, c);
    } else {
        c->held = true;
        srv->n_held++;
    }
    list_append(srv, ON_WAIT, c);
    c->waiting = true;
}

/*
 * The budget of c's turn: TURN_NS and TURN_FRAMES, or with a principal (an ACL) what its
 * connections left of them in this loop turn, so that a principal takes one connection's
 * share of the loop however many connections it opens. false: nothing is left (c waits).
 */
static bool turn_start(kvp_master_server_t *srv, conn_t *c, turn_t *t)
{
    uint64_t now = kvp_now_ns();
    *t = (turn_t){.end_ns = now + TURN_NS, .max_frames = TURN_FRAMES};
    kvp_principal_conns_t *pc = c->caller.pc;
    if (pc == NULL)
        return true;
    if (pc->turn != srv->turn) {
        pc->turn = srv->turn;
        pc->spent_ns = 0;
        pc->frames = 0;
    }
    if (pc->spent_ns >= TURN_NS || pc->frames >= TURN_FRAMES)
        return false;
    t->end_ns = now + (TURN_NS - pc->spent_ns);
    t->max_frames = TURN_FRAMES - pc->frames;
    return true;
}

/* Take c off the gated list (record gates, below), its gates gone. */
static void gated_unlink(kvp_master_server_t *srv, conn_t *c)
{
    list_unlink(srv, ON_GATED, c);
    c->n_gates = 0;
}

/* What c's input buffer counts against --max-input-buffers. */
static size_t in_extra(const conn_t *c)
{
    return c->in_cap > READ_CHUNK ? c->in_cap - READ_CHUNK : 0;
}

/* What the state holds of the server's (again after drop_all re-creates the state). */
static void attach_obs(kvp_master_server_t *srv)
{
    srv->state.events = kvp_events_sink(srv->events);
    srv->state.rpc_hist = srv->hist;
    srv->state.clients = srv->n_conns;
    srv->state.mount_proof = srv->prover != NULL;
}

/*
 * Close a connection's socket so that what the kernel holds for it still goes out. A close
 * with unread input resets the connection, and the kernel then drops what it had not sent
 * yet: a record change queued for an owner's SEG_RECORD stream (written before the replies
 * of the puts that made it, docs/architecture.md) could be lost after those puts were
 * acknowledged, if the master stops or loses leadership then. So what the peer sent and we
 * did not read is read first (and dropped; 256 KiB at most, never waiting), then FIN
 * follows the queued bytes.
 */
static void close_socket(int fd)
{
    char sink[4096];
    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        break;
    }
    shutdown(fd, SHUT_WR);
    close(fd);
}

/* c is to be closed at the end of the loop's turn (close_doomed), and is served no more:
 * this turn's event list may still name it, so it is not freed now. */
static void doom(kvp_master_server_t *srv, conn_t *c)
{
    if (c->doomed)
        return;
    c->doomed = true;
    srv->n_doomed++;
}

static void conn_close(kvp_master_server_t *srv, conn_t *c)
{
    for (parked_t **pp = &srv->parked; *pp != NULL;) {
        parked_t *p = *pp;
        if (p->conn_id == c->id) {
            *pp = p->next;
            explicit_bzero(p->body, p->len); /* a Mount's proof secret */
            free(p);
        } else {
            pp = &p->next;
        }
    }
    kvp_record_stream_closed(&srv->state.segments, c);
    uint64_t remount = 0;
    if (c->doomed)
        srv->n_doomed--;
    if (c->n_gates > 0)
        gated_unlink(srv, c);
    if (c->stream_seg != 0) {
        const kvp_segment_t *seg = kvp_segment_table_get(&srv->state.segments, c->stream_seg);
        /* (a draining segment's owner ends its stream itself: the segment is leaving) */
        uint64_t owner = seg != NULL && seg->record && !seg->draining ? seg->owner_conn_id : 0;
        /* lost: still in our buffer, or in the kernel's and never acknowledged (a reset
         * drops that too; plain tcp only: with TLS sent_total counts plaintext) */
        bool lost =
            out_backlog(c) > 0 || (c->ssl == NULL && kvp_sock_unacked(c->fd, c->sent_total));
        if (lost && owner != 0 && owner != c->id && !srv->closing_all) {
            /* changes its owner will never get on this stream (the next one starts after
             * them), so its record would miss them at a master restart: its owner's
             * connection is closed too, so that it mounts again, and its objects are taken
             * back into its record from the limbo (as for an owner dropped for silence) */
            srv->state.stats.record_lost++;
            /* (--segment-grace 0: no limbo to take them back from; a remount would only
             * adopt the owner's record as it is) */
            if (srv->state.config.segment_grace_ms > 0)
                remount = owner;
            KVP_LOG_WARN_LIMITED("record stream (connection %llu) closed with changes its owner "
                                 "did not get (%zu bytes still queued here): %s",
                                 (unsigned long long)c->id, out_backlog(c),
                                 remount != 0 ? "closing its owner's connection, so that it "
                                                "mounts again and its record is made whole"
                                              : "with --segment-grace 0 its record stays "
                                                "without them");
        }
        for (conn_t *g = srv->lists[ON_GATED].head; g != NULL; g = g->link_next[ON_GATED])
            for (unsigned i = 0; i < g->n_gates; i++)
                if (g->gates[i].stream == c)
                    g->gates[i].stream = NULL; /* release_gates lets g's replies go */
    }
    kvp_dispatch_conn_closed(&srv->state, c->id);
    kvp_admission_close(&srv->limits, &c->caller);
    srv->in_extra -= in_extra(c);
    srv->out_queued -= out_backlog(c);
    hold(srv, c, false);
    epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    kvp_tls_free(c->ssl);
    close_socket(c->fd);
    list_unlink(srv, ON_ALL, c);
    srv->n_conns--;
    srv->state.clients = srv->n_conns;
    KVP_LOG_DEBUG("connection %llu closed", (unsigned long long)c->id);
    free(c->in);
    free(c->out);
    free(c->gates);
    free(c);
    for (conn_t *o = srv->lists[ON_ALL].head; remount != 0 && o != NULL; o = o->link_next[ON_ALL])
        if (o->id == remount) {
            doom(srv, o);
            break;
        }
}

/* Close the connections doomed during the turn (conn_close: a record stream lost, its
 * owner's connection). Not at once: the turn's event list may still name them. */
static void close_doomed(kvp_master_server_t *srv)
{
    for (conn_t *c = srv->lists[ON_ALL].head, *next; c != NULL && srv->n_doomed > 0; c = next) {
        next = c->link_next[ON_ALL]; /* (conn_close frees c only, never another) */
        if (c->doomed)
            conn_close(srv, c);
    }
}

static bool out_reserve(conn_t *c, size_t n)
{
    if (c->out_off > 0 && c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + n <= c->out_cap)
        return true;
    if (c->out_off > 0) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
        if (c->out_len + n <= c->out_cap)
            return true;
    }
    if (c->out_len + n > KVP_MASTER_MAX_OUTBUF)
        return false;
    size_t cap = KVP_MAX(c->out_cap * 2, c->out_len + n);
    uint8_t *p = realloc(c->out, cap);
    if (p == NULL)
        return false;
    c->out = p;
    c->out_cap = cap;
    return true;
}

/* Queue one frame. false: the peer is not draining its replies, close it. */
static bool queue_frame(kvp_master_server_t *srv, conn_t *c, uint16_t method, uint64_t req_id,
                        int32_t status, const void *body, size_t len)
{
    if (!out_reserve(c, KVP_RPC_HDR_LEN + len))
        return false;
    kvp_rpc_hdr_t h = {.method = method,
                       .request_id = req_id,
                       .body_len = (uint32_t)len,
                       .status = status,
                       .epoch = srv->ha.epoch};
    kvp_rpc_hdr_pack(&h, c->out + c->out_len);
    if (len)
        memcpy(c->out + c->out_len + KVP_RPC_HDR_LEN, body, len);
    c->out_len += KVP_RPC_HDR_LEN + len;
    srv->out_queued += KVP_RPC_HDR_LEN + len;
    return true;
}

static void arm(kvp_master_server_t *srv, conn_t *c, bool want_out, bool paused)
{
    if (c->want_out == want_out && c->out_paused == paused)
        return;
    struct epoll_event ev = {.events = (paused ? 0 : EPOLLIN) | (want_out ? EPOLLOUT : 0),
                             .data.ptr = c};
    epoll_ctl(srv->epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want_out;
    c->out_paused = paused;
}

static void set_events(kvp_master_server_t *srv, conn_t *c, bool want_out)
{
    arm(srv, c, want_out, c->out_paused);
}

/* c's peer reads no replies: stop reading its requests (EPOLLIN off) until they drain. */
static void pause_out(kvp_master_server_t *srv, conn_t *c)
{
    if (c->out_paused)
        return;
    srv->state.stats.output_paused++;
    arm(srv, c, true, true);
}

/*
 * Record gates. An owner's record has a change before the writer has its answer because
 * push_records writes the record streams before the replies are flushed; but "written"
 * means into the stream's output buffer, and when the owner's socket is full (an owner
 * that sleeps, or reads slower than the writers put) the change waits here, in the
 * master's memory, where a kill -9 loses it, while the writer would already have been
 * told its put ended. So at the end of a turn, each record stream that the turn's
 * requests changed and that still holds queued bytes gates the connection: its replies go
 * out once the stream's socket has taken them (sent_total), the segment is gone or no
 * longer recorded, the stream closed (the owner remounts and offers its record afresh), or
 * --record-wait passed (answered anyway, counted and logged). A socket that takes what it
 * is given, as it does unless its owner stops reading, gates nothing.
 */
static bool gate_passed(kvp_master_server_t *srv, const gate_t *g)
{
    if (g->stream == NULL)
        return true;
    const kvp_segment_t *seg = kvp_segment_table_get(&srv->state.segments, g->seg_id);
    if (seg == NULL || !seg->record || seg->record_unwaited || seg->adopting)
        return true; /* unmounted (its objects left the index), its record given up,
                      * waited for --record-wait already, or its owner offering (gate_turn) */
    return g->stream->sent_total >= g->pos;
}

/* Drop c's passed gates; past --record-wait, the others too. true: none left (c is off
 * the gated list). */
static bool gates_open(kvp_master_server_t *srv, conn_t *c)
{
    unsigned k = 0;
    for (unsigned i = 0; i < c->n_gates; i++)
        if (!gate_passed(srv, &c->gates[i]))
            c->gates[k++] = c->gates[i];
    c->n_gates = k;
    if (k > 0 && srv->state.now_ms - c->gated_ms >= srv->state.config.record_wait_ms) {
        kvp_segment_t *seg = NULL;
        for (unsigned i = 0; i < k; i++) { /* (gate_passed: each is still there) */
            seg = kvp_segment_table_get(&srv->state.segments, c->gates[i].seg_id);
            seg->record_unwaited = true; /* one wait per stall, not one per writer's turn */
        }
        srv->state.stats.record_wait_expired++;
        KVP_LOG_WARN_LIMITED("segment %s: its owner took none of the record changes queued for "
                             "it within --record-wait (%u ms): connection %llu is answered "
                             "without them (a kill -9 of this master now would lose them)",
                             seg->name, srv->state.config.record_wait_ms,
                             (unsigned long long)c->id);
        k = 0;
    }
    if (k == 0)
        gated_unlink(srv, c);
    return k == 0;
}

static void gate_add(kvp_master_server_t *srv, conn_t *c, conn_t *stream, uint64_t seg_id,
                     uint64_t pos)
{
    for (unsigned i = 0; i < c->n_gates; i++)
        if (c->gates[i].stream == stream && c->gates[i].seg_id == seg_id) {
            c->gates[i].pos = KVP_MAX(c->gates[i].pos, pos);
            return;
        }
    if (c->n_gates == c->gates_cap) {
        unsigned cap = c->gates_cap ? c->gates_cap * 2 : 4;
        gate_t *g = realloc(c->gates, cap * sizeof(*g));
        if (g == NULL) {
            KVP_LOG_WARN_LIMITED("connection %llu: out of memory for a record gate: answered "
                                 "without waiting for its owner's stream",
                                 (unsigned long long)c->id);
            return;
        }
        c->gates = g;
        c->gates_cap = cap;
    }
    c->gates[c->n_gates++] = (gate_t){.stream = stream, .seg_id = seg_id, .pos = pos};
    if (c->n_gates == 1) {
        list_append(srv, ON_GATED, c);
        c->gated_ms = srv->state.now_ms;
        srv->state.stats.record_waits++;
    }
}

/* The segments whose record this turn changed, copied before push_records empties the list
 * (into srv->turn_dirty). 0: none, or --record-wait 0. */
static size_t turn_dirty(kvp_master_server_t *srv)
{
    const kvp_segment_table_t *t = &srv->state.segments;
    if (!t->records_dirty || t->n_dirty == 0 || srv->state.config.record_wait_ms == 0)
        return 0;
    if (t->n_dirty > srv->turn_dirty_cap) {
        uint64_t *p = realloc(srv->turn_dirty, t->n_dirty * sizeof(*p));
        if (p == NULL)
            return 0;
        srv->turn_dirty = p;
        srv->turn_dirty_cap = t->n_dirty;
    }
    memcpy(srv->turn_dirty, t->dirty_ids, t->n_dirty * sizeof(*t->dirty_ids));
    return t->n_dirty;
}

/* After push_records: gate c on each of the turn's record streams that did not take all. */
static void gate_turn(kvp_master_server_t *srv, conn_t *c, size_t n)
{
    if (c->stream_seg != 0)
        return; /* a stream waits for no other: streams waiting on each other would stall */
    if (c->adopted) {
        /* an owner's offer (Adopt) is made by its record thread, which reads the stream the
         * taken-back objects' changes go to only once the offer is answered: no writer
         * waits on this answer, and gating it on that stream would stall the offer */
        c->adopted = false;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(&srv->state.segments, srv->turn_dirty[i]);
        if (seg == NULL || !seg->record || seg->record_stream == NULL || seg->record_stream == c)
            continue;
        conn_t *stream = seg->record_stream;
        size_t left = stream->out_len - stream->out_off;
        if (left == 0 && seg->rec_len == 0) {
            seg->record_unwaited = false; /* it took everything: it is waited for again */
            continue;
        }
        /* not: a segment whose changes could not even be queued on its stream (its output
         * past KVP_MASTER_MAX_OUTBUF, or no memory: nothing to wait for), one waited for
         * --record-wait already, or one whose owner is offering its record (its record
         * thread reads the stream only once the offer is answered) */
        if (seg->rec_len > 0 || seg->record_unwaited || seg->adopting)
            continue;
        gate_add(srv, c, stream, seg->id, stream->sent_total + left);
    }
}

/* Write what the socket takes. false: the connection failed, close it. */
static bool flush_out(kvp_master_server_t *srv, conn_t *c)
{
    if (c->n_gates > 0 && !gates_open(srv, c)) {
        arm(srv, c, false, c->out_paused); /* release_gates flushes it when they open */
        return true;
    }
    while (c->out_off < c->out_len) {
        if (c->ssl != NULL) {
            char err[256];
            ssize_t n = kvp_tls_write(c->ssl, c->out + c->out_off, c->out_len - c->out_off, err,
                                      sizeof(err));
            if (n == KVP_TLS_WANT_WRITE || n == KVP_TLS_WANT_READ) {
                set_events(srv, c, true);
                return true;
            }
            if (n < 0)
                return false;
            c->out_off += (size_t)n;
            c->sent_total += (size_t)n;
            srv->out_queued -= (size_t)n;
            continue;
        }
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                set_events(srv, c, true);
                return true;
            }
            return false;
        }
        c->out_off += (size_t)n;
        c->sent_total += (size_t)n;
        srv->out_queued -= (size_t)n;
    }
    c->out_off = c->out_len = 0;
    if (c->out_cap > OUT_PAUSE) { /* a large reply went out: keep no large buffer */
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    if (c->out_paused) /* its replies are read: its requests are again, at its next turn */
        hold(srv, c, true);
    arm(srv, c, false, false);
    return !c->close_after;
}

static void reply_error(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h,
                        kvp_status_t status, const char *msg)
{
    queue_frame(srv, c, (uint16_t)(h->method | KVP_RPC_RESPONSE_BIT), h->request_id, status, msg,
                strlen(msg));
}

/* Queue what admission answered in the dispatcher's place (master/auth/admission.h). */
static void answer(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h,
                   const kvp_admission_reply_t *a)
{
    if (a->status == KVP_OK)
        queue_frame(srv, c, (uint16_t)(h->method | KVP_RPC_RESPONSE_BIT), h->request_id, 0, a->body,
                    a->len);
    else
        reply_error(srv, c, h, a->status, a->msg);
    if (a->close)
        c->close_after = true;
}

/* ---- high availability (master/ha/leadership.c) ---- */

/* Close every connection and let go of every held request. */
static void push_records(kvp_master_server_t *srv);

static void close_all(kvp_master_server_t *srv)
{
    /* what is queued in our buffers goes to the kernel first (one try each: a peer that
     * reads nothing does not hold the stop): the owners' records before the replies, as
     * in a loop turn */
    push_records(srv);
    for (uint32_t i = 0; i < srv->state.segments.n_slots; i++) {
        kvp_segment_t *seg = srv->state.segments.slots[i];
        if (seg != NULL && seg->record_stream != NULL)
            (void)flush_out(srv, seg->record_stream);
    }
    for (conn_t *c = srv->lists[ON_ALL].head; c != NULL; c = c->link_next[ON_ALL])
        (void)flush_out(srv, c);
    srv->closing_all = true; /* (no owner is doomed for its stream: all close) */
    while (srv->lists[ON_ALL].head != NULL)
        conn_close(srv, srv->lists[ON_ALL].head);
    srv->closing_all = false;
    while (srv->parked != NULL) {
        parked_t *p = srv->parked;
        srv->parked = p->next;
        explicit_bzero(p->body, p->len); /* a Mount's proof secret */
        free(p);
    }
}

/* Forget everything this master knew as a leader: every connection closes (clients find
 * the leader again and remount there), the metadata starts empty. */
static void drop_all(kvp_master_server_t *srv)
{
    close_all(srv);
    kvp_master_config_t cfg = srv->state.config;
    kvp_master_state_cleanup(&srv->state);
    kvp_master_state_init(&srv->state);
    srv->state.config = cfg;
    attach_obs(srv);
    kvp_credentials_restore(&srv->cred, &srv->state); /* the ACL's tenants, data grants */
}

static void drop_all_cb(void *arg)
{
    drop_all(arg);
}

/* Beginning to lead: the tenant quota policies set through /api/v1/tenant_quotas, as etcd
 * keeps them, over the ACL's, before the first request is served. An etcd that does not
 * answer: not yet (kvp_leadership_t.on_lead); a text that does not parse: the ACL's. */
static bool quotas_on_lead(void *arg, kvp_master_state_t *st)
{
    kvp_master_server_t *srv = arg;
    char *text, err[256] = "";
    size_t len;
    kvp_status_t s = kvp_quota_store_load(srv->quotas, &text, &len, err, sizeof(err));
    if (s != KVP_OK) {
        KVP_LOG_WARN_LIMITED("leading, but the tenant quota policies cannot be read from etcd "
                             "(%s: %s): not serving until they can",
                             kvp_strerror(s), err);
        return false;
    }
    if (!kvp_tenant_policy_load(&st->tenants, text, len))
        KVP_LOG_ERROR("the tenant quota policies in etcd do not parse: the ACL's quotas "
                      "apply until a PUT or DELETE of /api/v1/tenant_quotas writes them again");
    else if (len > 0)
        KVP_LOG_INFO("tenant quota policies from etcd: %zu bytes", len);
    free(text);
    return true;
}

kvp_status_t kvp_master_server_elect(kvp_master_server_t *srv, const kvp_election_params_t *p)
{
    kvp_status_t s = kvp_quota_store_create(p, &srv->quotas);
    if (s != KVP_OK)
        return s;
    srv->ha.on_lead = quotas_on_lead;
    srv->ha.on_lead_arg = srv;
    return kvp_leadership_start(&srv->ha, p);
}

/* Protected mode: a peer of another host gets KVP_ERR_DENIED for its first request, as soon
 * as its header is in (its body is never read), and the connection closes. */
static void refuse_protected(kvp_master_server_t *srv, conn_t *c)
{
    kvp_rpc_hdr_t h = {0};
    (void)kvp_rpc_hdr_unpack(c->in, KVP_RPC_MAX_BODY, &h); /* its id and method, if a frame */
    kvp_admission_reply_t a;
    kvp_admission_refuse_protected(&c->caller, &srv->state.stats, &a);
    answer(srv, c, &h, &a);
    c->in_len = 0;
}

/* ---- who is calling (master/auth/) ---- */

static void walk_callers(void *arg, void (*visit)(kvp_caller_t *c, void *ctx), void *ctx)
{
    kvp_master_server_t *srv = arg;
    for (conn_t *c = srv->lists[ON_ALL].head; c != NULL; c = c->link_next[ON_ALL])
        visit(&c->caller, ctx);
}

/* SIGHUP: the KV events' CURVE allow-list, the ACL and the TLS files. */
static void reload_security(kvp_master_server_t *srv)
{
    kvp_events_reload(srv->events);
    kvp_credentials_reload(&srv->cred, &srv->state, walk_callers, srv);
}

/* The loop's time on one request, into its method's latency histogram (/metrics). */
static void count_latency(kvp_master_server_t *srv, uint16_t method, const struct timespec *t0,
                          const struct timespec *t1)
{
    if (method > KVP_RPC_METHOD_MAX)
        return;
    uint64_t ns = (uint64_t)(t1->tv_sec - t0->tv_sec) * 1000000000u + (uint64_t)t1->tv_nsec -
                  (uint64_t)t0->tv_nsec;
    kvp_rpc_hist_t *hist = &srv->hist[method];
    unsigned b = 0;
    while (b < KVP_RPC_BUCKETS - 1 && ns > kvp_rpc_bucket_us[b] * 1000ull)
        b++;
    hist->count[b]++;
    hist->sum_ns += ns;
}

/* Run an admitted request through the method table, if this master may serve: its latency
 * counted, an admin action audited. *resp_p, *rlen_p and errmsg as kvp_dispatch_handle. */
static kvp_status_t dispatch_one(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h,
                                 const uint8_t *body, uint8_t **resp_p, size_t *rlen_p,
                                 char *errmsg, size_t errmsg_len)
{
    if (h->method & KVP_RPC_RESPONSE_BIT) {
        c->again = false;
        snprintf(errmsg, errmsg_len, "a response frame sent to the master");
        return KVP_ERR_PROTOCOL;
    }
    if (!kvp_leadership_may_serve(&srv->ha, &srv->state)) {
        /* a standby, or a leader not sure of its lease: nothing is answered, nothing
         * changes (fencing) */
        kvp_leadership_not_leader_msg(&srv->ha, errmsg, errmsg_len);
        c->again = false; /* (a batch under way ends here: its keys done so far stay done) */
        return KVP_ERR_NOT_LEADER;
    }
    srv->state.may_park = true;
    srv->state.park_retry = false;
    srv->state.may_continue = true;
    srv->state.call_again = c->again; /* in: this request again; out: not answered yet */
    c->again = false;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    srv->state.call_has_fd = true;
    srv->state.call_fd = c->fd;
    kvp_status_t s = kvp_dispatch_handle(&srv->state, c->id, c->caller.who, h->method, body,
                                         h->body_len, resp_p, rlen_p, errmsg, errmsg_len);
    srv->state.call_has_fd = false;
    srv->state.may_continue = false;
    c->again = srv->state.call_again;
    srv->state.call_again = false;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (c->again) { /* under way: counted and audited once, when it is answered */
        srv->state.may_park = false;
        return s;
    }
    if (s == KVP_ERR_DENIED) {
        char peer[80];
        kvp_sock_peer_name(c->fd, peer, sizeof(peer));
        KVP_LOG_WARN_LIMITED("connection %llu from %s: %s", (unsigned long long)c->id, peer,
                             errmsg);
    }
    kvp_audit_request(&c->caller, h->method, body, h->body_len, s, *resp_p, *rlen_p);
    srv->state.may_park = false;
    count_latency(srv, h->method, &t0, &t1);
    return s;
}

/* Hold a request without an answer (answer_parked answers it). */
static void park(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h, const uint8_t *body)
{
    parked_t *p = malloc(sizeof(*p) + h->body_len);
    if (p == NULL) {
        reply_error(srv, c, h, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    p->conn_id = c->id;
    p->req_id = h->request_id;
    p->method = h->method;
    p->deadline_ms = srv->state.now_ms + PARK_MS;
    p->proof_id = 0;
    p->proof = 0;
    p->why[0] = '\0';
    p->len = h->body_len;
    memcpy(p->body, body, h->body_len);
    p->next = srv->parked;
    srv->parked = p;
}

/* Hold a Mount while the server at its endpoint proves it serves the segment (the state's
 * proof_ask, wiped here): answer_proofs calls it again with the result. */
static void park_proof(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h,
                       const uint8_t *body)
{
    kvp_master_state_t *st = &srv->state;
    st->proof_asked = false;
    kvp_proof_job_t job = {.id = ++srv->next_proof,
                           .tag = c->caller.who != NULL ? c->caller.who->tag : 0,
                           .port = st->proof_ask.port};
    snprintf(job.host, sizeof(job.host), "%s", st->proof_ask.host);
    snprintf(job.name, sizeof(job.name), "%s", st->proof_ask.name);
    memcpy(job.secret, st->proof_ask.secret, sizeof(job.secret));
    explicit_bzero(st->proof_ask.secret, sizeof(st->proof_ask.secret));
    park(srv, c, h, body);
    parked_t *p = srv->parked; /* park puts it first */
    if (p == NULL || p->conn_id != c->id || p->req_id != h->request_id) {
        explicit_bzero(&job, sizeof(job)); /* out of memory: answered already */
        return;
    }
    p->proof_id = job.id;
    p->deadline_ms = st->now_ms + st->config.mount_proof_timeout_ms + PROOF_WAIT_MS;
    if (!kvp_prover_submit(srv->prover, &job)) {
        p->proof = -1;
        snprintf(p->why, sizeof(p->why),
                 "the master is proving %u mounts already: try again shortly",
                 kvp_prover_busy(srv->prover));
        srv->proofs_ready = true;
    }
    explicit_bzero(&job, sizeof(job));
}

/* After a request ran: bind a record stream (SegRecord), hold it (SsdTasks with no task
 * yet), or answer it. false: the peer is not draining its replies, close it. */
static bool finish_one(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h,
                       const uint8_t *body, kvp_status_t s, const uint8_t *resp, size_t rlen,
                       const char *errmsg)
{
    if (srv->state.stream_segment != 0) {
        /* SegRecord: this connection now carries the segment's record changes */
        kvp_segment_t *seg = kvp_segment_table_get(&srv->state.segments, srv->state.stream_segment);
        srv->state.stream_segment = 0;
        if (seg != NULL) {
            kvp_record_stream_open(&srv->state.segments, seg, c, h->request_id);
            c->stream_seg = seg->id;
        }
    } else if (srv->state.parked) {
        srv->state.parked = false;
        if (srv->state.proof_asked)
            park_proof(srv, c, h, body);
        else
            park(srv, c, h, body);
    } else if (kvp_rpc_is_oneway(h->method)) {
        /* the sender waits for nothing: an error is only logged */
        if (s != KVP_OK)
            KVP_LOG_WARN_LIMITED("connection %llu: one-way method %u: %s",
                                 (unsigned long long)c->id, h->method, errmsg);
    } else if (s == KVP_OK) {
        return queue_frame(srv, c, (uint16_t)(h->method | KVP_RPC_RESPONSE_BIT), h->request_id, 0,
                           resp, rlen);
    } else {
        reply_error(srv, c, h, s, errmsg);
    }
    return true;
}

/* c authenticates once it names a principal (with an ACL), or without one once a whole
 * frame of it came in: from then on it is not among the unauthenticated (the caps,
 * --auth-timeout). */
static void note_authenticated(kvp_master_server_t *srv, conn_t *c, bool whole_frame)
{
    if (!c->caller.admitted && (srv->cred.acl != NULL ? c->caller.who != NULL : whole_frame))
        kvp_admission_authenticated(&srv->limits, &c->caller);
}

static void close_with(kvp_master_server_t *srv, conn_t *c, kvp_status_t status, const char *msg);

/* c's TLS handshake ended: a certificate the ACL names makes its principal, which counts
 * its connections (--max-connections-per-principal). false: c was closed, told why. */
static bool note_cert(kvp_master_server_t *srv, conn_t *c)
{
    kvp_admission_check_cert(srv->cred.acl, &c->caller, c->ssl);
    note_authenticated(srv, c, false);
    kvp_admission_reply_t a;
    if (kvp_admission_principal(&srv->limits, &c->caller, &srv->state.stats, &a))
        return true;
    close_with(srv, c, a.status, a.msg);
    return false;
}

/* Dispatch the whole frames in the input buffer, while c's turn lasts and its replies are
 * read (out_full); what is left stays for its next turn. false: close the connection. */
static bool process_frames(kvp_master_server_t *srv, conn_t *c, turn_t *turn)
{
    if (c->refuse) {
        if (c->in_len >= KVP_RPC_HDR_LEN && !c->close_after)
            refuse_protected(srv, c);
        return true;
    }
    size_t off = 0;
    while (!c->close_after && !turn_over(turn) && !out_full(srv, c)) {
        kvp_rpc_hdr_t h;
        size_t flen;
        uint32_t max_body = kvp_admission_max_body(srv->cred.acl, &c->caller);
        kvp_status_t s = kvp_rpc_frame_scan(c->in + off, c->in_len - off, max_body, &h, &flen);
        if (s == KVP_ERR_PENDING) {
            /* The buffer grows as bytes arrive (on_readable), not from what a header
             * announces: a peer that sends a header and stalls pins no memory. */
            break;
        }
        if (s == KVP_ERR_PROTOCOL) {
            KVP_LOG_WARN_LIMITED("connection %llu: not a kvpool frame (bad magic); closing",
                                 (unsigned long long)c->id);
            return false;
        }
        if (s != KVP_OK) {
            char msg[256];
            snprintf(msg, sizeof(msg),
                     "%s (version %u, body %u bytes; this master speaks "
                     "version %u, at most %u bytes%s)",
                     kvp_strerror(s), h.version, h.body_len, KVP_RPC_VERSION, max_body,
                     max_body == KVP_PREAUTH_MAX_BODY ? " before authentication" : "");
            KVP_LOG_WARN_LIMITED("connection %llu: %s; closing", (unsigned long long)c->id, msg);
            reply_error(srv, c, &h, s, msg);
            c->close_after = true;
            break;
        }
        uint8_t *body = c->in + off + KVP_RPC_HDR_LEN;
        kvp_admission_reply_t a;
        if (srv->cred.acl != NULL &&
            !kvp_admission_admit(srv->cred.acl, &c->caller, &srv->state.stats, &h, body, &a)) {
            /* (an Auth that named the principal: counted among its connections, or refused) */
            (void)kvp_admission_principal(&srv->limits, &c->caller, &srv->state.stats, &a);
            answer(srv, c, &h, &a);
            c->again = false; /* (a batch under way refused now: answered, it ends) */
            off += flen;
            continue;
        }
        uint8_t *resp = NULL;
        size_t rlen = 0;
        char errmsg[256] = "";
        s = dispatch_one(srv, c, &h, body, &resp, &rlen, errmsg, sizeof(errmsg));
        if (c->again) { /* a batch under way: this frame again at c's next turn, its turn
                         * over now (the frames behind it wait: their order is kept) */
            free(resp);
            turn->frames = turn->max_frames;
            break;
        }
        if (h.method == KVP_RPC_ADOPT)
            c->adopted = true; /* gate_turn */
        bool ok = finish_one(srv, c, &h, body, s, resp, rlen, errmsg);
        free(resp);
        off += flen;
        turn->frames++;
        if (!ok)
            return false;
    }
    if (off > 0) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
        /* liveness and the frame deadline count whole frames, never bytes */
        c->last_rx_ms = srv->state.now_ms;
        c->frame_start_ms = 0;
        note_authenticated(srv, c, true);
    }
    return true;
}

/* process_frames, what it took charged to c's principal's share of this loop turn
 * (turn_start; before c may close: the count goes with its last connection). */
static bool process_input(kvp_master_server_t *srv, conn_t *c, turn_t *turn)
{
    uint64_t t0 = kvp_now_ns();
    unsigned f0 = turn->frames;
    bool ok = process_frames(srv, c, turn);
    kvp_principal_conns_t *pc = c->caller.pc; /* (named in this turn: charged from now on) */
    if (pc != NULL) {
        if (pc->turn != srv->turn) {
            pc->turn = srv->turn;
            pc->spent_ns = 0;
            pc->frames = 0;
        }
        pc->spent_ns += kvp_now_ns() - t0;
        pc->frames += turn->frames - f0;
    }
    return ok;
}

/*
 * Close c for a limit or a deadline, telling it why (status, msg) where it can still hear
 * us: a frame answering the request whose header is in (else request id 0), written if the
 * socket takes it at once. A TLS session not established yet is just closed.
 */
static void close_with(kvp_master_server_t *srv, conn_t *c, kvp_status_t status, const char *msg)
{
    if (c->ssl == NULL || kvp_tls_established(c->ssl)) {
        kvp_rpc_hdr_t h = {0};
        if (c->in_len >= KVP_RPC_HDR_LEN)
            (void)kvp_rpc_hdr_unpack(c->in, KVP_RPC_MAX_BODY, &h);
        reply_error(srv, c, &h, status, msg);
        (void)flush_out(srv, c);
    }
    conn_close(srv, c);
}

/*
 * Room to read into c->in: the buffer doubles from READ_CHUNK as bytes arrive, never past
 * the frame its header announces (a length prefix alone allocates nothing), and what the
 * buffers hold past READ_CHUNK stays under --max-input-buffers for all connections
 * together. false: c was closed (out of memory, or over that cap: counted, told).
 */
static bool in_grow(kvp_master_server_t *srv, conn_t *c)
{
    size_t bound = READ_CHUNK;
    kvp_rpc_hdr_t h = {0};
    if (c->in_len >= KVP_RPC_HDR_LEN &&
        kvp_rpc_hdr_unpack(c->in, kvp_admission_max_body(srv->cred.acl, &c->caller), &h) == KVP_OK)
        bound = KVP_MAX(bound, KVP_RPC_HDR_LEN + (size_t)h.body_len);
    size_t cap = KVP_MIN(KVP_MAX(c->in_cap * 2, (size_t)READ_CHUNK), bound);
    if (cap <= c->in_cap)
        return true;
    size_t add = (cap > READ_CHUNK ? cap - READ_CHUNK : 0) - in_extra(c);
    uint64_t max = srv->state.config.max_input_bytes;
    if (max != 0 && add > 0 && srv->in_extra + add > max) {
        srv->state.stats.refused_input_buffers++;
        char peer[80], msg[256];
        kvp_sock_peer_name(c->fd, peer, sizeof(peer));
        snprintf(msg, sizeof(msg),
                 "the master holds %llu bytes of unfinished requests, its cap "
                 "(--max-input-buffers %llu): a frame of %u bytes does not fit now; retry",
                 (unsigned long long)srv->in_extra, (unsigned long long)max, h.body_len);
        KVP_LOG_WARN_LIMITED("connection %llu from %s (principal %s) closed: %s",
                             (unsigned long long)c->id, peer,
                             c->caller.pname[0] ? c->caller.pname : "none", msg);
        close_with(srv, c, KVP_ERR_NOMEM, msg);
        return false;
    }
    uint8_t *p = realloc(c->in, cap);
    if (p == NULL) {
        conn_close(srv, c);
        return false;
    }
    c->in = p;
    c->in_cap = cap;
    srv->in_extra += add;
    return true;
}

/* A request went through: give back what its buffer holds past READ_CHUNK. */
static void in_shrink(kvp_master_server_t *srv, conn_t *c)
{
    if (c->in_cap <= READ_CHUNK || c->in_len > READ_CHUNK / 2)
        return;
    srv->in_extra -= in_extra(c);
    if (c->in_len == 0) {
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
        return;
    }
    uint8_t *p = realloc(c->in, READ_CHUNK);
    if (p != NULL) {
        c->in = p;
        c->in_cap = READ_CHUNK;
    }
    srv->in_extra += in_extra(c);
}

/* Read one TLS or plain chunk into c->in: > 0 bytes read, 0 nothing now (EAGAIN, or TLS
 * wants more; c->in_len unchanged), -1 c was closed. */
static ssize_t read_some(kvp_master_server_t *srv, conn_t *c)
{
    for (;;) {
        if (c->in_cap - c->in_len < READ_CHUNK / 4 && !in_grow(srv, c))
            return -1;
        ssize_t n;
        if (c->ssl != NULL) {
            char err[256];
            n = kvp_tls_read(c->ssl, c->in + c->in_len, c->in_cap - c->in_len, err, sizeof(err));
            if (n == KVP_TLS_WANT_READ || n == KVP_TLS_WANT_WRITE) {
                if (n == KVP_TLS_WANT_WRITE)
                    set_events(srv, c, true);
                if (!c->caller.cert_checked && kvp_tls_established(c->ssl) && !note_cert(srv, c))
                    return -1;
                return 0;
            }
            if (n < 0) {
                char peer[80];
                kvp_sock_peer_name(c->fd, peer, sizeof(peer));
                srv->state.stats.refused_tls++;
                KVP_LOG_WARN_LIMITED("connection %llu from %s refused: %s",
                                     (unsigned long long)c->id, peer, err);
                conn_close(srv, c);
                return -1;
            }
            if (n > 0 && !c->caller.cert_checked && !note_cert(srv, c))
                return -1;
        } else {
            n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        }
        if (n > 0) {
            c->in_len += (size_t)n;
            return n;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        conn_close(srv, c); /* the peer closed, or the socket failed */
        return -1;
    }
}

/*
 * c's turn: handle the whole frames it sent, reading more as it comes, until the socket is
 * empty, c is closed, its replies go unread (out_full: paused until they drain), or its
 * turn is over (TURN_FRAMES, TURN_NS: held, and served again at the loop's next turn, after
 * every other connection had its chance), so no peer holds the loop, however many
 * requests it sends at once.
 */
static void on_readable(kvp_master_server_t *srv, conn_t *c)
{
    turn_t turn;
    if (!turn_start(srv, c, &turn)) {
        wait_turn(srv, c); /* its principal's other connections took this loop turn's share */
        return;
    }
    push_records(srv); /* changes made before this turn are not this turn's (gate_turn) */
    c->turn = srv->turn;
    hold(srv, c, false);
    bool more = c->in_len > 0; /* what an earlier turn left */
    for (;;) {
        if (c->close_after)
            c->in_len = 0; /* it is answered and closes: what else it sends is never read */
        if (more) {
            if (!process_input(srv, c, &turn)) {
                conn_close(srv, c);
                return;
            }
            if (c->in_len == 0 || c->again)
                c->frame_start_ms = 0; /* (a batch under way is whole: no frame begun) */
            else if (c->frame_start_ms == 0)
                c->frame_start_ms = srv->state.now_ms; /* a frame begun: --frame-timeout */
            if (c->close_after)
                break;
            if (out_full(srv, c)) {
                pause_out(srv, c);
                break;
            }
            if (turn_over(&turn) || turn.bytes >= READ_BUDGET) {
                hold(srv, c, true); /* TLS may hold decrypted bytes epoll cannot see */
                break;
            }
        }
        ssize_t n = read_some(srv, c);
        if (n < 0)
            return; /* closed */
        if (n == 0)
            break;
        turn.bytes += (size_t)n;
        more = true;
    }
    /* An owner's record learns of the puts that just ended before their writers do: its
     * stream is written first (meta/record.c), and where it could not take all of it, c's
     * replies wait for it (gate_turn). */
    size_t dirty = turn_dirty(srv);
    push_records(srv);
    if (dirty > 0)
        gate_turn(srv, c, dirty);
    c->adopted = false;
    in_shrink(srv, c);
    if (!flush_out(srv, c))
        conn_close(srv, c);
}

/* Give each connection held at its last turn (input left) its next one; a connection served
 * in this turn already, or whose output is paused, waits for the next. Each is taken from
 * the head of the held list and put back at its tail (on_readable lets it go if its input
 * is done), so a walk costs what is held, not every connection times that. Those that
 * waited for their principal's share (ON_WAIT) go first, in their order, so that each of a
 * principal's connections gets its turn. One served may close others (a record stream
 * whose write fails: they leave the list), hence the count rather than a pointer kept
 * across the call. */
static void serve_held(kvp_master_server_t *srv)
{
    for (conn_t *w; (w = srv->lists[ON_WAIT].tail) != NULL;) {
        list_unlink(srv, ON_WAIT, w);
        w->waiting = false;
        struct conn_list *h = &srv->lists[ON_HELD]; /* (to its head) */
        w->link_prev[ON_HELD] = NULL;
        w->link_next[ON_HELD] = h->head;
        if (h->head != NULL)
            h->head->link_prev[ON_HELD] = w;
        else
            h->tail = w;
        h->head = w;
    }
    for (unsigned left = srv->n_held; left > 0 && srv->lists[ON_HELD].head != NULL; left--) {
        conn_t *c = srv->lists[ON_HELD].head;
        list_unlink(srv, ON_HELD, c);
        list_append(srv, ON_HELD, c);
        if (!c->out_paused && c->turn != srv->turn && !c->doomed)
            on_readable(srv, c);
    }
}

/* Stop watching the listener for LISTEN_PAUSE_MS: accept failed for want of memory or
 * descriptors, and retrying at once would only spin. */
static void pause_listener(kvp_master_server_t *srv, int err)
{
    struct epoll_event ev = {.events = 0, .data.ptr = &srv->listen_fd};
    epoll_ctl(srv->epfd, EPOLL_CTL_MOD, srv->listen_fd, &ev);
    srv->listen_paused_ms = srv->state.now_ms + LISTEN_PAUSE_MS;
    KVP_LOG_WARN_LIMITED("accept failed: %s; %u connections open; not accepting for %u ms",
                         strerror(err), srv->n_conns, LISTEN_PAUSE_MS);
}

/* Watch the listener again once its pause is over (and take a reserve descriptor back). */
static void resume_listener(kvp_master_server_t *srv)
{
    if (srv->listen_paused_ms == 0 || srv->state.now_ms < srv->listen_paused_ms)
        return;
    if (srv->reserve_fd < 0)
        srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &srv->listen_fd};
    epoll_ctl(srv->epfd, EPOLL_CTL_MOD, srv->listen_fd, &ev);
    srv->listen_paused_ms = 0;
}

/* No descriptor left (EMFILE, ENFILE): close the reserved one, accept the pending
 * connection and close it at once (counted), take the reserve back. false: nothing to do
 * so (no reserve, or it could not be taken back): pause the listener instead. */
static bool shed_one(kvp_master_server_t *srv)
{
    if (srv->reserve_fd < 0)
        return false;
    close(srv->reserve_fd);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = accept4(srv->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
    if (fd >= 0) {
        char peer[80];
        kvp_sock_peer_name(fd, peer, sizeof(peer));
        close(fd);
        srv->state.stats.refused_descriptors++;
        KVP_LOG_WARN_LIMITED("connection from %s refused: no descriptor left (RLIMIT_NOFILE; %u "
                             "connections open)",
                             peer, srv->n_conns);
    }
    srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd >= 0 && srv->reserve_fd >= 0;
}

/* At most this many accepts per wakeup: a flood of connections cannot keep the loop from
 * the requests of the connections it has. */
#define ACCEPT_BATCH 64

static void on_accept(kvp_master_server_t *srv)
{
    for (unsigned i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(srv->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED || err == EPROTO)
                continue; /* that connection's trouble, not the listener's */
            if (err == EAGAIN || err == EWOULDBLOCK)
                return;
            if ((err == EMFILE || err == ENFILE) && shed_one(srv))
                continue;
            pause_listener(srv, err);
            return;
        }
        conn_t *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->id = ++srv->next_conn_id;
        c->caller.conn_id = c->id;
        c->caller.fd = fd;
        /* the caps, before any TLS state is made for it (master/auth/admission.c) */
        kvp_caller_t *victim;
        kvp_admit_verdict_t v;
        while ((v = kvp_admission_open(&srv->limits, &c->caller, &ss, srv->state.now_ms,
                                       &srv->state.stats, &victim)) == KVP_ADMIT_EVICT) {
            conn_t *vc = (conn_t *)((char *)victim - offsetof(conn_t, caller));
            kvp_admission_close(&srv->limits, &vc->caller); /* its place is the new one's */
            doom(srv, vc); /* not freed here: this turn's events may name it */
        }
        if (v != KVP_ADMIT_OK) {
            close(fd);
            free(c);
            continue;
        }
        /* replies go out at once: over TLS a large reply is several records, and Nagle
         * would hold each record's last partial segment for the client's delayed ACK */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        /* credentials configured: anyone may connect, and must name a principal */
        c->refuse = kvp_admission_refuses(&srv->state.config, srv->cred.tls != NULL, fd);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if ((srv->cred.tls != NULL && kvp_tls_accept(srv->cred.tls, fd, &c->ssl) != KVP_OK) ||
            epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            kvp_admission_close(&srv->limits, &c->caller);
            kvp_tls_free(c->ssl);
            close(fd);
            free(c);
            continue;
        }
        c->last_rx_ms = srv->state.now_ms;
        list_append(srv, ON_ALL, c);
        srv->n_conns++;
        srv->state.clients = srv->n_conns;
        KVP_LOG_DEBUG("connection %llu accepted", (unsigned long long)c->id);
    }
}

/* --http-listen and --kv-events-bind (master/obs/). */
static kvp_status_t start_obs(kvp_master_server_t *srv)
{
    const kvp_master_config_t *cfg = &srv->state.config;
    srv->http_fd = -1;
    if (strcmp(cfg->http_listen, "off") != 0) {
        uint16_t port = 0;
        bool tls = cfg->tls_cert[0] != '\0'; /* HTTPS with the same certificate */
        kvp_status_t s = kvp_master_http_start(
            cfg->http_listen, tls ? cfg->tls_cert : NULL, tls ? cfg->tls_key : NULL,
            tls && cfg->tls_ca[0] != '\0' ? cfg->tls_ca : NULL, &srv->http, &port);
        if (s != KVP_OK && cfg->http_listen_given) {
            KVP_LOG_ERROR("--http-listen %s: %s", cfg->http_listen,
                          s == KVP_ERR_INVALID_ARG ? "needs IPV4:PORT (or off)"
                                                   : "cannot listen there");
            return s;
        }
        if (s != KVP_OK) {
            KVP_LOG_WARN("HTTP (/metrics, /health) not served: cannot listen on the default %s "
                         "(taken?); give --http-listen HOST:PORT or off",
                         cfg->http_listen);
        } else {
            srv->http_fd = kvp_master_http_fd(srv->http);
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &srv->http_fd};
            epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->http_fd, &ev);
            char host[256];
            uint16_t p0;
            kvp_parse_hostport(cfg->http_listen, host, sizeof(host), &p0);
            KVP_LOG_INFO("HTTP on %s:%u (/metrics, /health, /api/v1/...)", host, port);
        }
    }
    if (cfg->kv_events_bind[0] != '\0') {
        kvp_events_params_t p;
        kvp_events_params_init(&p);
        p.bind = cfg->kv_events_bind;
        p.replay_bind = cfg->kv_events_replay[0] ? cfg->kv_events_replay : NULL;
        p.topic = cfg->kv_events_topic;
        p.queue_max = cfg->kv_events_queue;
        p.replay_batches = cfg->kv_events_replay_batches;
        p.model_name = cfg->kv_events_model;
        p.block_size = cfg->kv_events_block_size;
        p.tenant_id = cfg->kv_events_tenant;
        p.backend_id = cfg->kv_events_backend_id;
        p.dp_rank = (int32_t)cfg->kv_events_dp_rank;
        p.curve_secret = cfg->kv_events_curve_secret;
        p.curve_allow = cfg->kv_events_curve_allow;
        p.tenants = cfg->acl_file[0] != '\0';
        char err[256] = "";
        kvp_status_t s = kvp_events_create(&p, &srv->events, err, sizeof(err));
        if (s != KVP_OK) {
            KVP_LOG_ERROR("--kv-events-bind %s: %s", cfg->kv_events_bind,
                          err[0] ? err : kvp_strerror(s));
            kvp_master_http_stop(srv->http);
            srv->http = NULL;
            return s;
        }
        const char *replay = kvp_events_endpoint(srv->events, 1);
        KVP_LOG_INFO("KV events on %s (replay: %s)", kvp_events_endpoint(srv->events, 0),
                     replay != NULL && replay[0] ? replay : "none");
    }
    return KVP_OK;
}

/* The views' RPCs (master/obs/http_views.c): a request of no connection and no principal. */
static kvp_status_t call_as_client(kvp_master_state_t *st, uint16_t method, const uint8_t *body,
                                   size_t body_len, uint8_t **resp_p, size_t *resp_len_p,
                                   char *errmsg, size_t errmsg_len)
{
    return kvp_dispatch_handle(st, 0, NULL, method, body, body_len, resp_p, resp_len_p, errmsg,
                               errmsg_len);
}

/* The method table's names by id, for the per-method metrics. */
static void name_methods(kvp_master_server_t *srv)
{
    size_t n;
    const kvp_method_t *tab = kvp_dispatch_table(&n);
    for (size_t m = 0; m < n && m < KVP_ARRAY_SIZE(srv->method_names); m++)
        srv->method_names[m] = tab[m].name;
}

/* Bytes of record changes the owners have not received: queued for their segments, in
 * their streams' buffers (plaintext), and what their sockets hold unacknowledged (with TLS:
 * records). What a kill -9 of this master now would lose. */
static uint64_t record_unsent(const kvp_segment_table_t *t)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < t->n_slots; i++) {
        const kvp_segment_t *seg = t->slots[i];
        if (seg == NULL || !seg->record)
            continue;
        n += seg->rec_len;
        const conn_t *c = seg->record_stream;
        if (c != NULL)
            n += out_backlog(c) + kvp_sock_outq(c->fd);
    }
    return n;
}

/* For the views (master/obs/): does this master serve (no side effects, unlike
 * kvp_leadership_may_serve), and what it knows beyond the state. */
static void fill_view(kvp_master_server_t *srv, kvp_master_view_t *v, char *reason, size_t len)
{
    srv->state.stats.output_queued = srv->out_queued;
    v->ha = srv->ha.el != NULL;
    v->self = srv->ha.self;
    v->events = srv->events;
    v->acl = srv->cred.acl;
    v->tls = srv->cred.tls;
    v->quotas = srv->quotas;
    v->call = call_as_client;
    v->record_unsent = record_unsent;
    v->method_names = srv->method_names;
    v->n_methods = KVP_ARRAY_SIZE(srv->method_names);
    v->serving = kvp_leadership_serving(&srv->ha);
    reason[0] = '\0';
    if (!v->serving)
        kvp_leadership_not_leader_msg(&srv->ha, reason, len);
    v->reason = reason;
}

/* The connection caps (master/auth/admission.c): --max-connections within what the
 * descriptor limit leaves room for, and a reserved descriptor for accept-and-close when
 * descriptors run out. */
static void start_limits(kvp_master_server_t *srv)
{
    const kvp_master_config_t *cfg = &srv->state.config;
    uint32_t room = 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        rlim_t reserve = KVP_MIN((rlim_t)FD_RESERVE, rl.rlim_cur / 4);
        rlim_t r = rl.rlim_cur - reserve;
        room = r > UINT32_MAX ? UINT32_MAX : r == 0 ? 1 : (uint32_t)r;
    }
    kvp_admission_limits_init(&srv->limits, cfg, room);
    srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (room != 0 && srv->limits.max_conns == room &&
        (cfg->max_conns == 0 || room < cfg->max_conns))
        KVP_LOG_INFO("at most %u connections: the descriptor limit (RLIMIT_NOFILE %llu) "
                     "leaves room for no more (--max-connections %u)",
                     srv->limits.max_conns, (unsigned long long)rl.rlim_cur, cfg->max_conns);
}

kvp_status_t kvp_master_server_create(const char *host, uint16_t port,
                                      const kvp_master_config_t *config,
                                      kvp_master_server_t **srv_p, uint16_t *bound_port_p)
{
    kvp_master_server_t *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return KVP_ERR_NOMEM;
    kvp_leadership_init(&srv->ha);
    kvp_status_t status = kvp_master_state_init(&srv->state);
    if (status != KVP_OK)
        goto err_free;
    if (config != NULL)
        srv->state.config = *config;
    status = kvp_credentials_load(&srv->cred, &srv->state);
    if (status != KVP_OK)
        goto err_state;
    /* the owners of a restarted master's segments come back within a heartbeat or so */
    srv->state.rebuild_until_ms = kvp_now_ms() + KVP_REBUILD_GRACE_MS;
    status = kvp_tcp_listen(host, port, 1024, &srv->listen_fd, bound_port_p);
    if (status != KVP_OK) {
        KVP_LOG_ERROR("--listen %s:%u: cannot listen there: %s", host, port, kvp_strerror(status));
        goto err_state;
    }
    if (fcntl(srv->listen_fd, F_SETFL, fcntl(srv->listen_fd, F_GETFL) | O_NONBLOCK) != 0) {
        status = KVP_ERR_SYSTEM;
        goto err_listen;
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP); /* reloads the ACL */
    pthread_sigmask(SIG_BLOCK, &mask, NULL);
    srv->sig_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    srv->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (srv->sig_fd < 0 || srv->epfd < 0) {
        status = KVP_ERR_SYSTEM;
        goto err_fds;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &srv->listen_fd};
    epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->listen_fd, &ev);
    ev.data.ptr = &srv->sig_fd;
    epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->sig_fd, &ev);
    /* threads of their own from here on: they inherit the blocked signals */
    if (srv->state.config.mount_proof) {
        status = kvp_prover_create(PROOF_THREADS, PROOF_PER_PRINCIPAL, PROOF_QUEUE,
                                   srv->state.config.mount_proof_timeout_ms, &srv->prover);
        if (status != KVP_OK)
            goto err_fds;
        ev.data.ptr = &srv->prover;
        epoll_ctl(srv->epfd, EPOLL_CTL_ADD, kvp_prover_fd(srv->prover), &ev);
    }
    status = start_obs(srv);
    if (status != KVP_OK)
        goto err_fds;
    attach_obs(srv);
    name_methods(srv);
    start_limits(srv);
    *srv_p = srv;
    return KVP_OK;

err_fds:
    if (srv->sig_fd >= 0)
        close(srv->sig_fd);
    if (srv->epfd >= 0)
        close(srv->epfd);
err_listen:
    close(srv->listen_fd);
err_state:
    kvp_credentials_cleanup(&srv->cred);
    kvp_master_state_cleanup(&srv->state);
err_free:
    free(srv);
    return status;
}

/* Are bytes of c waiting in its socket, unread? (the loop was busy, not the peer) */
static bool bytes_waiting(const conn_t *c)
{
    char byte;
    return recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
}

/* Close c for a deadline (counted, logged, told why where it can hear). */
static void expire(kvp_master_server_t *srv, conn_t *c, uint64_t *counter, const char *what,
                   const char *flag, uint32_t limit_ms)
{
    (*counter)++;
    char peer[80], msg[200];
    kvp_sock_peer_name(c->fd, peer, sizeof(peer));
    snprintf(msg, sizeof(msg), "%s within %u ms (%s): closing", what, limit_ms, flag);
    KVP_LOG_WARN_LIMITED("connection %llu from %s (principal %s): %s", (unsigned long long)c->id,
                         peer, c->caller.pname[0] ? c->caller.pname : "none", msg);
    close_with(srv, c, KVP_ERR_TIMEOUT, msg);
}

/* Does c wait for a Mount's proof (its request held: not silent of its own doing)? */
static bool proving(const kvp_master_server_t *srv, const conn_t *c)
{
    for (const parked_t *p = srv->parked; p != NULL; p = p->next)
        if (p->conn_id == c->id && p->proof_id != 0)
            return true;
    return false;
}

/*
 * Deadlines, whatever a peer trickles meanwhile: a connection must authenticate within
 * --auth-timeout of its accept, and a frame must be whole within --frame-timeout of its
 * first byte.
 *
 * Liveness: clients heartbeat every second, so a connection that has sent no whole frame
 * for --client-ttl belongs to a dead, frozen or cut-off client. Closing it unmounts its
 * segments and revokes its puts; a client that was only slow reconnects and remounts on
 * its next heartbeat.
 */
static void expire_silent(kvp_master_server_t *srv)
{
    const kvp_master_config_t *cfg = &srv->state.config;
    kvp_master_stats_t *stats = &srv->state.stats;
    uint64_t now = srv->state.now_ms;
    uint32_t ttl = cfg->client_ttl_ms;
    conn_t *c = srv->lists[ON_ALL].head;
    while (c != NULL) {
        conn_t *next = c->link_next[ON_ALL];
        if (cfg->auth_timeout_ms != 0 && c->caller.counted && !c->caller.admitted &&
            now - c->caller.accepted_ms > cfg->auth_timeout_ms) {
            expire(srv, c, &stats->refused_auth_timeout, "not authenticated", "--auth-timeout",
                   cfg->auth_timeout_ms);
            c = next;
            continue;
        }
        /* bytes waiting unread: the loop was busy (a long request), not the peer */
        if (cfg->frame_timeout_ms != 0 && c->frame_start_ms != 0 &&
            now - c->frame_start_ms > cfg->frame_timeout_ms && !bytes_waiting(c)) {
            expire(srv, c, &stats->refused_frame_timeout, "a frame begun was not whole",
                   "--frame-timeout", cfg->frame_timeout_ms);
            c = next;
            continue;
        }
        if (c->stream_seg != 0 && c->sent_total != c->sent_seen) {
            /* its owner's kernel takes the changes: its owner pings only a quiet stream
             * (client/control/record_sync.c) */
            c->sent_seen = c->sent_total;
            c->last_rx_ms = now;
        }
        uint64_t silent = now - c->last_rx_ms;
        if (ttl != 0 && silent > ttl && bytes_waiting(c)) {
            c->last_rx_ms = now;
            silent = 0;
        }
        if (ttl != 0 && silent > ttl && !proving(srv, c)) {
            KVP_LOG_WARN("connection %llu silent for %llu ms (client ttl %u ms): dropping it, "
                         "its segments and its unfinished puts",
                         (unsigned long long)c->id, (unsigned long long)silent, ttl);
            conn_close(srv, c);
        }
        c = next;
    }
}

static conn_t *conn_find(kvp_master_server_t *srv, uint64_t id)
{
    for (conn_t *c = srv->lists[ON_ALL].head; c != NULL; c = c->link_next[ON_ALL])
        if (c->id == id)
            return c;
    return NULL;
}

/* One SegRecord frame of seg's record changes on its stream (kvp_record_write_cb_t). */
static bool write_record(void *arg, kvp_segment_t *seg)
{
    kvp_master_server_t *srv = arg;
    conn_t *c = seg->record_stream;
    Kvpool__SegRecordResponse resp = KVPOOL__SEG_RECORD_RESPONSE__INIT;
    resp.changes.data = seg->rec;
    resp.changes.len = seg->rec_len;
    resp.broken = seg->record_broken;
    size_t len = kvpool__seg_record_response__get_packed_size(&resp);
    if (!out_reserve(c, KVP_RPC_HDR_LEN + len))
        return false;
    kvp_rpc_hdr_t h = {.method = KVP_RPC_SEG_RECORD | KVP_RPC_RESPONSE_BIT,
                       .request_id = seg->record_req_id,
                       .body_len = (uint32_t)len,
                       .epoch = srv->ha.epoch};
    kvp_rpc_hdr_pack(&h, c->out + c->out_len);
    kvpool__seg_record_response__pack(&resp, c->out + c->out_len + KVP_RPC_HDR_LEN);
    c->out_len += KVP_RPC_HDR_LEN + len;
    srv->out_queued += KVP_RPC_HDR_LEN + len;
    if (!flush_out(srv, c))
        set_events(srv, c, true); /* the loop sees the failure again and closes c */
    return true;
}

/*
 * Write each listed segment's queued record changes on its owner's SegRecord stream
 * (meta/record.c): called before the replies of the requests that made them are
 * flushed, so an owner's record has an object before its writer has the answer.
 */
static void push_records(kvp_master_server_t *srv)
{
    kvp_record_push(&srv->state.segments, write_record, srv);
}

/* Flush the gated connections whose streams took what they waited for (or whose
 * --record-wait is over): each loop turn, the list being empty unless an owner's socket
 * is full. */
static void release_gates(kvp_master_server_t *srv)
{
    for (conn_t *c = srv->lists[ON_GATED].head, *next; c != NULL; c = next) {
        next = c->link_next[ON_GATED];
        if (gates_open(srv, c) && !flush_out(srv, c))
            conn_close(srv, c);
    }
}

/* Call the held requests again (a task was queued, or their time is up): those that get
 * an answer are answered and let go. */
static void answer_parked(kvp_master_server_t *srv, bool tick)
{
    kvp_master_state_t *st = &srv->state;
    if (srv->parked == NULL || (!st->tasks_ready && !tick))
        return;
    st->tasks_ready = false;
    for (parked_t **pp = &srv->parked; *pp != NULL;) {
        parked_t *p = *pp;
        if (p->proof_id != 0) { /* a Mount: answer_proofs */
            pp = &p->next;
            continue;
        }
        conn_t *c = conn_find(srv, p->conn_id);
        if (c == NULL) {
            *pp = p->next;
            free(p);
            continue;
        }
        uint8_t *resp = NULL;
        size_t rlen = 0;
        char errmsg[256] = "";
        st->may_park = st->now_ms < p->deadline_ms;
        st->park_retry = true;
        kvp_admission_reply_t a;
        if (!kvp_admission_still_admitted(srv->cred.acl, &c->caller, &st->stats, &a)) {
            kvp_rpc_hdr_t h = {.method = p->method, .request_id = p->req_id};
            answer(srv, c, &h, &a);
            set_events(srv, c, true); /* the loop writes it, then closes c */
            *pp = p->next;
            free(p);
            continue;
        }
        kvp_status_t s = kvp_dispatch_handle(st, c->id, c->caller.who, p->method, p->body, p->len,
                                             &resp, &rlen, errmsg, sizeof(errmsg));
        st->may_park = false;
        st->park_retry = false;
        if (st->parked) {
            st->parked = false;
            free(resp);
            pp = &p->next;
            continue;
        }
        kvp_rpc_hdr_t h = {.method = p->method, .request_id = p->req_id};
        if (s == KVP_OK)
            queue_frame(srv, c, (uint16_t)(p->method | KVP_RPC_RESPONSE_BIT), p->req_id, 0, resp,
                        rlen);
        else
            reply_error(srv, c, &h, s, errmsg);
        free(resp);
        set_events(srv, c, true); /* the loop writes it (and closes c if that fails) */
        *pp = p->next;
        free(p);
    }
}

/* The probes' results (auth/mount_proof.h), onto their held Mounts; and, on the tick, the
 * Mounts whose probe has not answered in time (it will not be waited for). */
static void take_proofs(kvp_master_server_t *srv, bool tick)
{
    kvp_proof_result_t res[64];
    size_t n;
    while (!tick && (n = kvp_prover_take(srv->prover, res, KVP_ARRAY_SIZE(res))) > 0) {
        for (size_t i = 0; i < n; i++) {
            for (parked_t *p = srv->parked; p != NULL; p = p->next) {
                if (p->proof_id != res[i].id || p->proof != 0)
                    continue;
                p->proof = res[i].ok ? 1 : -1;
                snprintf(p->why, sizeof(p->why), "%s", res[i].why);
                srv->proofs_ready = true;
                KVP_LOG_DEBUG("connection %llu: mount proof %s in %u ms",
                              (unsigned long long)p->conn_id, res[i].ok ? "passed" : "failed",
                              res[i].ms);
                break;
            }
        }
        if (n < KVP_ARRAY_SIZE(res))
            break;
    }
    if (tick)
        for (parked_t *p = srv->parked; p != NULL; p = p->next)
            if (p->proof_id != 0 && p->proof == 0 && srv->state.now_ms >= p->deadline_ms) {
                p->proof = -1;
                snprintf(p->why, sizeof(p->why), "no result from the master's prover in time");
                srv->proofs_ready = true;
            }
}

/* Call each held Mount whose proof has its result again (answered now, whatever it says;
 * everything is checked again: the pool may have changed while it was proven). */
static void answer_proofs(kvp_master_server_t *srv)
{
    kvp_master_state_t *st = &srv->state;
    if (!srv->proofs_ready)
        return;
    srv->proofs_ready = false;
    for (parked_t **pp = &srv->parked; *pp != NULL;) {
        parked_t *p = *pp;
        if (p->proof_id == 0 || p->proof == 0) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        conn_t *c = conn_find(srv, p->conn_id);
        kvp_rpc_hdr_t h = {.method = p->method, .request_id = p->req_id};
        kvp_admission_reply_t a;
        if (c == NULL) {
            /* gone meanwhile: nothing to answer */
        } else if (!kvp_admission_still_admitted(srv->cred.acl, &c->caller, &st->stats, &a)) {
            answer(srv, c, &h, &a);
            set_events(srv, c, true);
        } else {
            uint8_t *resp = NULL;
            size_t rlen = 0;
            char errmsg[256] = "";
            kvp_status_t s;
            if (!kvp_leadership_may_serve(&srv->ha, st)) {
                kvp_leadership_not_leader_msg(&srv->ha, errmsg, sizeof(errmsg));
                s = KVP_ERR_NOT_LEADER;
            } else {
                st->proof_result = p->proof;
                snprintf(st->proof_why, sizeof(st->proof_why), "%s", p->why);
                st->call_has_fd = true;
                st->call_fd = c->fd;
                s = kvp_dispatch_handle(st, c->id, c->caller.who, p->method, p->body, p->len, &resp,
                                        &rlen, errmsg, sizeof(errmsg));
                st->call_has_fd = false;
                st->proof_result = 0;
                st->parked = st->proof_asked = false; /* (a proven call asks nothing) */
                kvp_audit_request(&c->caller, p->method, p->body, p->len, s, resp, rlen);
            }
            if (s == KVP_OK)
                queue_frame(srv, c, (uint16_t)(p->method | KVP_RPC_RESPONSE_BIT), p->req_id, 0,
                            resp, rlen);
            else
                reply_error(srv, c, &h, s, errmsg);
            free(resp);
            c->last_rx_ms = st->now_ms; /* --client-ttl counts from the answer it waited for */
            set_events(srv, c, true);   /* the loop writes it (and closes c if that fails) */
        }
        explicit_bzero(p->body, p->len); /* the owner's proof secret */
        free(p);
    }
}

kvp_status_t kvp_master_server_run(kvp_master_server_t *srv)
{
    struct epoll_event evs[128];
    uint64_t next_tick = 0;
    while (!srv->stop) {
        /* Timers: twice a second, reclaim timed-out puts and keep usage under the high
         * watermark (puts also check it, this catches quiet periods). */
        srv->state.now_ms = kvp_now_ms();
        if (srv->state.now_ms >= next_tick || srv->ha.reset_pending) {
            kvp_leadership_tick(&srv->ha, &srv->state, srv->n_conns, drop_all_cb, srv);
            expire_silent(srv);
            if (kvp_leadership_may_serve(
                    &srv->ha, &srv->state)) { /* a fenced leader changes nothing by itself either */
                kvp_expire_puts(&srv->state);
                kvp_lease_expire(&srv->state);
                kvp_segment_limbo_expire(&srv->state);
                kvp_task_tick(&srv->state);
                kvp_hot_tick(&srv->state);
                kvp_evict_if_needed(&srv->state);
                answer_parked(srv, true);
            }
            if (srv->prover != NULL) {
                take_proofs(srv, true);
                answer_proofs(srv);
            }
            next_tick = srv->state.now_ms + TICK_MS;
        }
        resume_listener(srv);
        bool sweeping = kvp_object_sweeping(&srv->state);
        if (sweeping) /* closed connections' puts, a slice a turn */
            kvp_object_sweep(&srv->state);
        if (srv->state.n_group_evictions > 0 && kvp_leadership_may_serve(&srv->ha, &srv->state)) {
            kvp_evict_groups_continue(&srv->state); /* victims' groups, a slice a turn */
            sweeping = sweeping || srv->state.n_group_evictions > 0;
        }
        uint64_t wake = next_tick;
        if (srv->listen_paused_ms != 0 && srv->listen_paused_ms < wake)
            wake = srv->listen_paused_ms;
        for (conn_t *g = srv->lists[ON_GATED].head; g != NULL;
             g = g->link_next[ON_GATED]) /* --record-wait */
            wake = KVP_MIN(wake, g->gated_ms + srv->state.config.record_wait_ms);
        int n = epoll_wait(srv->epfd, evs, (int)KVP_ARRAY_SIZE(evs),
                           wake > srv->state.now_ms && srv->n_held == 0 && srv->n_doomed == 0 &&
                                   !sweeping
                               ? (int)(wake - srv->state.now_ms)
                               : 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            KVP_LOG_ERROR("epoll_wait failed: %m");
            return KVP_ERR_SYSTEM;
        }
        srv->state.now_ms = kvp_now_ms();
        srv->turn++;
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &srv->listen_fd) {
                on_accept(srv);
            } else if (p == &srv->prover) {
                take_proofs(srv, false);
            } else if (p == &srv->http_fd) {
                kvp_master_view_t view;
                char reason[256];
                fill_view(srv, &view, reason, sizeof(reason));
                kvp_master_http_serve(srv->http, &srv->state, &view);
            } else if (p == &srv->sig_fd) {
                struct signalfd_siginfo si;
                if (read(srv->sig_fd, &si, sizeof(si)) == sizeof(si)) {
                    if (si.ssi_signo == SIGHUP) {
                        reload_security(srv);
                    } else {
                        KVP_LOG_INFO("signal %u: shutting down", si.ssi_signo);
                        srv->stop = true;
                    }
                }
            } else {
                conn_t *c = p;
                if (c->doomed) {
                    /* closed at the end of the turn (close_doomed) */
                } else if (c->out_paused && (evs[i].events & (EPOLLHUP | EPOLLERR))) {
                    conn_close(srv, c); /* gone without reading its replies */
                } else if (c->caller.pc != NULL &&
                           (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                    /* a principal's connection: served in serve_held, in its order with
                     * the principal's others (its share of the turn), never ahead of them;
                     * what it may be sent goes now */
                    if ((evs[i].events & EPOLLOUT) && !flush_out(srv, c))
                        conn_close(srv, c);
                    else if (!c->held)
                        hold(srv, c, true);
                } else if ((evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ||
                           (c->ssl != NULL && !kvp_tls_established(c->ssl))) {
                    /* (a TLS handshake that waited to write goes on reading) */
                    on_readable(srv, c);
                    /* c may be freed now: never touch it again in this iteration */
                } else if (evs[i].events & EPOLLOUT) {
                    if (!flush_out(srv, c))
                        conn_close(srv, c);
                }
            }
        }
        serve_held(srv);    /* the connections whose turn ended with requests left */
        answer_proofs(srv); /* mounts whose endpoints proved themselves (or did not) */
        if (srv->state.tasks_ready && kvp_leadership_may_serve(&srv->ha, &srv->state))
            answer_parked(srv, false); /* tasks queued by what just ran */
        push_records(srv);             /* changes made by timers and by what just ran */
        release_gates(srv);            /* replies whose record streams took their changes */
        if (srv->n_doomed > 0)
            close_doomed(srv); /* owners whose record streams were lost */
    }
    return KVP_OK;
}

void kvp_master_server_destroy(kvp_master_server_t *srv)
{
    if (srv == NULL)
        return;
    kvp_leadership_stop(&srv->ha);   /* a standby takes over at once */
    kvp_master_http_stop(srv->http); /* its threads wait for no loop any more */
    kvp_quota_store_destroy(srv->quotas);
    close_all(srv);
    kvp_prover_destroy(srv->prover); /* a probe under way ends within its timeout */
    kvp_admission_limits_cleanup(&srv->limits);
    if (srv->reserve_fd >= 0)
        close(srv->reserve_fd);
    close(srv->listen_fd);
    close(srv->sig_fd);
    close(srv->epfd);
    kvp_credentials_cleanup(&srv->cred);
    kvp_master_state_cleanup(&srv->state);
    kvp_events_destroy(srv->events); /* sends what is still queued */
    free(srv->turn_dirty);
    free(srv);
}
