/*
 * harness.h - start real kvpool processes for tests, the libuv way: a child
 * tells us it is ready by writing a line to a pipe (--ready-fd 3); no sleeps,
 * no log scraping. Every child is killed by its PID and reaped, and a
 * non-zero exit (ASan/LSan findings, a crash) is reported to the caller.
 */
#ifndef KVP_TESTS_HARNESS_H
#define KVP_TESTS_HARNESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvp_proc {
    pid_t pid;
    char ready[512]; /* the line the child wrote to its ready fd, without newline */
} kvp_proc_t;

/* Path of the master / CLI binaries, from $KVPOOL_MASTER_BIN / $KVPOOL_CLI_BIN. */
const char *kvp_test_master_bin(void);
const char *kvp_test_cli_bin(void);
/* The transport a suite is re-run with: $KVPOOL_TRANSPORT when set (the rdma
 * suite sets "rdma" inside the Soft-RoCE VM), else NULL. */
const char *kvp_test_transport(void);
/* The TLS pass's certificate directory: $KVPOOL_TEST_TLS_DIR when set (deploy/test.sh: every
 * master runs TLS 1.3 with its certificates and ACL), else NULL. */
const char *kvp_test_tls_dir(void);

/*
 * Start argv[0] with argv (NULL-terminated), its fd 3 the write end of a
 * pipe; wait up to timeout_ms for one line on it. false on failure (the
 * child, if started, is killed and reaped).
 */
bool kvp_proc_start(kvp_proc_t *p, char *const argv[], int timeout_ms);

/*
 * Start kvpool-master on 127.0.0.1:0 with --lease-ttl 0 (no read leases);
 * p->ready holds "127.0.0.1:PORT". _args: the defaults plus extra flags
 * (NULL-terminated), read leases included.
 */
bool kvp_start_master(kvp_proc_t *p);
bool kvp_start_master_args(kvp_proc_t *p, char *const extra[]);

/* Start `kvpool serve` with a segment; p->ready holds the segment name. */
bool kvp_start_segment(kvp_proc_t *p, const char *master, const char *size, const char *transport);

/*
 * SIGTERM (or `sig`) the child and reap it, waiting up to timeout_ms then
 * SIGKILL. Returns the exit status (0 = clean), 128+signal if it died of a
 * signal other than the one sent, -1 if it had to be SIGKILLed.
 */
int kvp_proc_stop(kvp_proc_t *p, int sig, int timeout_ms);

/*
 * Wait up to timeout_ms for the child to exit by itself and reap it: its exit
 * status, 128+signal, or -1 on timeout (it is then SIGKILLed).
 */
int kvp_proc_wait_exit(kvp_proc_t *p, int timeout_ms);

/* SIGKILL and reap (for fault tests). */
void kvp_proc_kill9(kvp_proc_t *p);

/* Run a command to completion with optional stdin file and stdout capture. */
int kvp_run(char *const argv[], const char *stdin_path, char *out, size_t out_len, int timeout_ms);

/* Resident set size of a process in KiB, and its open fd count. */
long kvp_proc_rss_kib(pid_t pid);
/* SIGSTOP pid and wait until every one of its threads is stopped (kill() does not wait);
 * false when that did not happen within timeout_ms. */
bool kvp_proc_freeze(pid_t pid, int timeout_ms);
int kvp_proc_fd_count(pid_t pid);

/* Deterministic test pattern: byte i of object `seed`. */
void kvp_fill_pattern(void *buf, size_t len, uint64_t seed);

/* Whether *flag is (or becomes) true within ms milliseconds; polled every millisecond. */
bool kvp_wait_flag(atomic_bool *flag, int ms);

/*
 * A private etcd on 127.0.0.1 (1..KVP_ETCD_MAX_MEMBERS members), for the etcd
 * and HA tests. Data and logs live in a mkdtemp directory under $TMPDIR (or
 * /tmp) that kvp_stop_etcd removes. Ports are drawn at random from 20000-32767
 * (below the kernel's ephemeral range, so no client socket can take them),
 * and a start that fails on a port conflict is retried with new ports.
 * Ready means every member answers {"health":"true"} on GET /health.
 * `endpoints` is "127.0.0.1:P1[,127.0.0.1:P2...]" for kvp_etcd_create.
 */
#define KVP_ETCD_MAX_MEMBERS 5
typedef struct kvp_etcd_proc {
    int n;
    pid_t pid[KVP_ETCD_MAX_MEMBERS];
    int client_port[KVP_ETCD_MAX_MEMBERS];
    int peer_port[KVP_ETCD_MAX_MEMBERS];
    char dir[256];
    char endpoints[KVP_ETCD_MAX_MEMBERS * 24];
} kvp_etcd_proc_t;

/* Whether the etcd binary is on $PATH. */
bool kvp_etcd_available(void);
/* One member, random ports. false (with the reason and etcd's log on stderr) on failure. */
bool kvp_start_etcd(kvp_etcd_proc_t *p);
/* One member whose client port is client_port (no retry on conflict). */
bool kvp_start_etcd_port(kvp_etcd_proc_t *p, int client_port);
/* An n-member cluster, random ports. */
bool kvp_start_etcd_cluster(kvp_etcd_proc_t *p, int n);
/* SIGKILL member i and reap it (the others keep running). */
void kvp_kill_etcd_member(kvp_etcd_proc_t *p, int i);
/* SIGTERM member i and reap it (a clean stop: its data dir stays). */
void kvp_stop_etcd_member(kvp_etcd_proc_t *p, int i);
/* Start a stopped or killed member i again on its ports and data; wait until healthy. */
bool kvp_restart_etcd_member(kvp_etcd_proc_t *p, int i);
/* Stop every member still running (SIGTERM, then SIGKILL after 5 s), reap, remove the dir. */
void kvp_stop_etcd(kvp_etcd_proc_t *p);
/* A port in the harness's range that nothing listens on now. */
int kvp_etcd_free_port(void);
/* GET path from 127.0.0.1:port (libcurl; tls: HTTPS, with the TLS pass's CA and admin
 * certificate): the whole answer (status line, headers, body) in buf, NUL-terminated; its
 * length (0: no answer). */
size_t kvp_http_get(int port, const char *path, bool tls, char *buf, size_t cap);
/* The value of the unlabelled metric `name` in 127.0.0.1:port's /metrics (a master's: HTTPS
 * in the TLS pass); -1 if absent or unreadable. */
double kvp_http_metric(int port, const char *name);

#endif
