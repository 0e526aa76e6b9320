/*
 * fault_util.h - helpers for the fault-injection suite (tests/fault/):
 * starting a master with flags that may not exist yet in this build,
 * killing / stopping children by PID and checking how they died, waiting
 * for a process state, and raw control-plane sockets (24-byte RPC frames,
 * common/rpc.h) written out byte by byte.
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

/* ---- raw control-plane sockets ---- */

/* Little-endian RPC header (status 0). */
void fault_rpc_hdr(uint8_t out[FAULT_RPC_HDR], uint32_t magic, uint16_t version, uint16_t method,
                   uint64_t req_id, uint32_t body_len);

/* A connected TCP socket to "host:port" (IPv4 literal), TCP_NODELAY; -1 on failure. */
int fault_connect(const char *hostport);

/* Send everything; false on error. */
bool fault_send_all(int fd, const void *buf, size_t len);

/*
 * Read exactly len bytes within timeout_ms: len; 0 if the peer closed before
 * the first byte; -1 on timeout, error or a close mid-way.
 */
ssize_t fault_recv_exact(int fd, void *buf, size_t len, int timeout_ms);

/*
 * Whether the peer closes within timeout_ms with nothing more to read:
 * 0 closed (or reset), 1 bytes arrived instead, -1 still open.
 */
int fault_wait_closed(int fd, int timeout_ms);

typedef struct fault_frame {
    uint32_t magic;
    uint16_t version;
    uint16_t method;
    uint64_t req_id;
    uint32_t body_len;
    int32_t status;
} fault_frame_t;

/* Read one RPC frame header and skip its body (<= 64 KiB). false on timeout/close/garbage. */
bool fault_read_frame(int fd, fault_frame_t *f, int timeout_ms);

#endif
