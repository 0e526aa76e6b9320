/*
 * fault_util.h - helpers for the fault-injection suite (tests/fault/):
 * starting a master with flags that may not exist yet in this build,
 * killing / stopping children by PID and checking how they died, waiting
 * for a process state, and raw connections (plain or TLS 1.3) for the 32-byte
 * RPC frames of the control plane (common/rpc.h) written out byte by byte and
 * for the data plane's requests.
 *
 * Nothing here uses cmocka: the helpers are called from worker threads
 * too, and report failures by return value.
 */
#ifndef KVP_TESTS_FAULT_UTIL_H
#define KVP_TESTS_FAULT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tests/harness.h"

#define FAULT_RPC_MAGIC 0x3150564Bu
#define FAULT_RPC_HDR 32
#define FAULT_RPC_VERSION 2
#define FAULT_RPC_RESP 0x8000u
#define FAULT_M_PING 1
#define FAULT_M_PUT_START 4
#define FAULT_M_STAT 11

/* Whether `kvpool-master --help` mentions `flag` (e.g. "--client-ttl"). Cached per flag. */
bool fault_master_has_flag(const char *flag);

/*
 * Start kvpool-master with the harness defaults plus `extra` (NULL-terminated).
 * When `ttl_optional` is set and this master build has no --client-ttl, the
 * "--client-ttl VALUE" pair is left out (with a note on stderr): for tests
 * whose fault closes the connection anyway, the TTL is only a backstop.
 */
bool fault_start_master(kvp_proc_t *p, const char *const *extra, bool ttl_optional);

/*
 * SIGKILL a child started by the harness and reap it. Returns 0 when it died
 * of that SIGKILL; otherwise how it had ended before: 128 + signal (it
 * crashed), 1000 + exit code (it exited by itself); -1 on a wait error.
 */
int fault_kill9(kvp_proc_t *p);

/* The same for a bare pid (a forked child): 0 when it died of our SIGKILL. */
int fault_kill9_pid(pid_t pid);

/* The state letter of /proc/PID/stat ('R', 'S', 'T', 'Z', ...), or 0. */
char fault_proc_state(pid_t pid);

/* Wait until the process's state letter is `state`; false after timeout_ms. */
bool fault_wait_state(pid_t pid, char state, int timeout_ms);

/* Wait until pid has `want` open fds; returns the last count seen. */
int fault_wait_fd_count(pid_t pid, int want, int timeout_ms);

/* Sleep for ms milliseconds (between polls; never as synchronisation). */
void fault_sleep_ms(unsigned ms);

/* ---- raw connections: plain, or TLS 1.3 ---- */

/*
 * Whether this run is deploy/test.sh's TLS pass: $KVPOOL_TEST_TLS_DIR is set, so the
 * harness starts every master with TLS 1.3 and an ACL (data grants on), and the honest
 * raw frames must go over TLS with the client certificate of $KVPOOL_TLS_*.
 */
bool fault_tls_pass(void);

/* Little-endian RPC header (status 0). */
void fault_rpc_hdr(uint8_t out[FAULT_RPC_HDR], uint32_t magic, uint16_t version, uint16_t method,
                   uint64_t req_id, uint32_t body_len);

/*
 * A raw connection: a TCP socket, and with TLS an OpenSSL session on it. Its calls may
 * be made from any thread, one thread per connection. Over TLS a peer's close without
 * close_notify reads as a close; writes may raise SIGPIPE (the caller ignores it).
 */
typedef struct fault_conn {
    int fd;
    struct ssl_st *ssl; /* NULL: plain */
} fault_conn_t;

/*
 * Connect to "host:port" (IPv4 literal), TCP_NODELAY. With tls: a TLS 1.3 handshake
 * within timeout_ms that verifies the peer's certificate against $KVPOOL_TLS_CA and the
 * address dialled, presenting $KVPOOL_TLS_CERT / $KVPOOL_TLS_KEY when with_cert (else no
 * certificate: a connection that names no principal). false on failure (why on stderr
 * for TLS); nothing to close then.
 */
bool fault_conn_open(fault_conn_t *c, const char *hostport, bool tls, bool with_cert,
                     int timeout_ms);

/* Close our side, with no close_notify: a forked child that holds a copy of the socket
 * keeps the session as it is. */
void fault_conn_close(fault_conn_t *c);

/* Send everything within timeout_ms; false on error, a close or the timeout. */
bool fault_conn_send(fault_conn_t *c, const void *buf, size_t len, int timeout_ms);

/*
 * Read exactly len bytes within timeout_ms: len; 0 if the peer closed (or reset) before
 * the first byte; -1 on timeout, error or a close mid-way.
 */
ssize_t fault_conn_recv_exact(fault_conn_t *c, void *buf, size_t len, int timeout_ms);

/*
 * Read until the peer closes (FIN, reset, close_notify) within timeout_ms, keeping the
 * first cap bytes in buf (NULL with cap 0: none): how many bytes came before the close
 * (possibly more than cap); -1 when the connection is still open after timeout_ms or
 * broke otherwise.
 */
ssize_t fault_conn_until_closed(fault_conn_t *c, void *buf, size_t cap, int timeout_ms);

typedef struct fault_frame {
    uint32_t magic;
    uint16_t version;
    uint16_t method;
    uint64_t req_id;
    uint32_t body_len;
    int32_t status;
} fault_frame_t;

/*
 * Read one RPC frame within timeout_ms: its header into *f and its body into body (at
 * most cap bytes; NULL: the body, up to 64 KiB, is skipped). false on timeout, a close,
 * garbage or a body that does not fit.
 */
bool fault_conn_read_frame(fault_conn_t *c, fault_frame_t *f, void *body, size_t cap,
                           int timeout_ms);

#endif
