/*
 * cli.h - what the files of the kvpool command share: the command table's entry, the
 * global options a command runs under, the exit codes, and the helpers of cli_common.c
 * (errors and usage, number parsing, the client, signals, output).
 *
 * Every command is one handler in the table of main.c; it parses its own options from
 * argv re-based at the command name (getopt_long, optind already reset), checks all of
 * its input before it connects, and returns the process's exit status.
 *
 * Helpers that "return -1 or an exit code" report their own error: -1 means go on, any
 * other value is what the command returns at once.
 */
#ifndef KVP_CLIENT_TOOLS_CLI_CLI_H
#define KVP_CLIENT_TOOLS_CLI_CLI_H

#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "client/include/kvpool.h"
#include "client/tools/cli/progress.h"
#include "common/options.h"

/* Exit status: 0 success; 1 the operation failed ("kvpool: WHAT: WHY" on stderr);
 * 2 usage error (the message and the usage text on stderr). `exist` follows test(1):
 * 0 all keys exist, 1 some key does not, 2 error. */
enum { KVP_CLI_OK = 0, KVP_CLI_FAIL = 1, KVP_CLI_USAGE = 2 };

/* Progress reports (kvp_cli_t.progress): on long work only, always, never. */
enum { KVP_CLI_PROGRESS_AUTO = 0, KVP_CLI_PROGRESS_ALWAYS, KVP_CLI_PROGRESS_NEVER };

/* The global options, parsed by main.c before the command (the rows of its option table,
 * kvp_cli_global_opts, are over this struct). */
typedef struct kvp_cli {
    const char *master;       /* "host:port", already validated */
    const char *transport;    /* NULL: library default */
    uint32_t timeout_ms;      /* 0: library default */
    const char *rdma_devices; /* NULL: library default */
    const char *rdma_host;
    /* the master connection's security; NULL: the library's ($KVPOOL_TLS_*, $KVPOOL_TOKEN) */
    const char *tls_cert;
    const char *tls_key;
    const char *tls_ca;
    const char *token; /* read from --token-file (never a flag: ps would show it) */
    unsigned given;    /* bit i: row i of kvp_cli_global_opts was set on the command line
                        * before the command */
    int progress;      /* KVP_CLI_PROGRESS_* */
} kvp_cli_t;

typedef struct kvp_cli_command kvp_cli_command_t;

/* A command: argv starts at the command's name; returns the exit status. */
typedef int (*kvp_cli_run_cb_t)(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc,
                                char **argv);

/* An entry of the command table (main.c). */
struct kvp_cli_command {
    const char *name;     /* "put" */
    const char *group;    /* the file that holds it: "object", "admin", "serve" */
    const char *args;     /* the usage line after the name */
    kvp_cli_run_cb_t run; /* the handler */
};

/* ---- the commands ------------------------------------------------------- */

/* cli_object.c */
int kvp_cli_put(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv);
int kvp_cli_get(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv);
int kvp_cli_exist(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv);
int kvp_cli_rm(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv);
int kvp_cli_ls(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv);
/* cli_admin.c */
int kvp_cli_drain(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv);
int kvp_cli_stat(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv);
/* `rm --regex RE` (regex NULL: `rm --all`), its input already checked. */
int kvp_cli_rm_matching(const kvp_cli_t *cli, const char *regex, bool force);
/* serve.c */
int kvp_cli_serve(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv);

/* ---- main.c: usage and the global options ------------------------------- */

/* The whole usage text (kvpool --help) on `out`. */
void kvp_cli_usage(FILE *out);

/* The global options that every command runs under and that `kvpool serve` also takes
 * after its name and as keys of its config file (common/options.h rows over *cli; NULL
 * for their words or getopt entries only). */
kvp_opts_t kvp_cli_global_opts(kvp_cli_t *cli);

/*
 * Apply row `row` of kvp_cli_global_opts with argument `arg` to *cli. Returns -1 when
 * done, or the usage error's exit code (reported). `cmd`: the command whose argv carried
 * it (serve's config file), NULL before the command.
 */
int kvp_cli_global_set(kvp_cli_t *cli, const kvp_cli_command_t *cmd, const kvp_opt_t *row,
                       const char *arg);

/* Whether row `row` of kvp_cli_global_opts was given before the command (cli->given). */
bool kvp_cli_global_given(const kvp_cli_t *cli, const kvp_opt_t *row);

/* The master address must be HOST:PORT or an etcd:// URL; -1 or the usage error's code.
 * `from` names where it came from ("--master", "$KVPOOL_MASTER"). */
int kvp_cli_check_master(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, const char *from);

/* ---- cli_common.c ------------------------------------------------------- */

/* "kvpool: WHAT: WHY" on stderr, WHY being kvp_strerror() or strerror(); returns
 * KVP_CLI_FAIL. */
int kvp_cli_fail(const char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Why a call failed, for kvp_cli_fail: a refusal in the peer's own words (a master's ACL
 * reason), else st's text. */
const char *kvp_cli_why(kvp_status_t st);
/* The token in a file (one line; at most 1023 bytes), in a static buffer; NULL: none. */
const char *kvp_cli_read_token(const char *path);

/* The message, then the command's usage line (cmd NULL: the whole text) on stderr;
 * returns KVP_CLI_USAGE. */
int kvp_cli_usage_error(const kvp_cli_command_t *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* What a command's getopt loop does with an option it does not take itself: 'h' prints
 * the usage on stdout (KVP_CLI_OK); '?' and ':' are usage errors naming the option. */
int kvp_cli_option_other(const kvp_cli_command_t *cmd, int opt, int argc, char **argv);

/* Parse the options of a command that has none but --help: -1, or the exit code when the
 * command must stop now. */
int kvp_cli_parse_no_options(const kvp_cli_command_t *cmd, int argc, char **argv);

/* Decimal unsigned integer in [0, max]; false on anything else. */
bool kvp_cli_parse_uint(const char *text, uint64_t max, uint64_t *value_p);

/* Seconds in [0, 86400], fractions allowed; false on anything else. */
bool kvp_cli_parse_seconds(const char *text, double *value_p);

/* Connect to the master of the global options; params NULL: no segment. Reports its own
 * failure on stderr. */
kvp_status_t kvp_cli_client_open(const kvp_cli_t *cli, kvp_client_params_t *params,
                                 kvp_client_t **client_p);

/* Whether to report progress for work that is long (`long_work`) or not. */
bool kvp_cli_progress_wanted(const kvp_cli_t *cli, bool long_work);

/* Progress of "VERB NAME" (NAME cut at 256 bytes); the arguments after as
 * kvp_progress_start's. */
kvp_progress_t *kvp_cli_progress_start(const char *verb, const char *name, uint64_t total,
                                       bool bytes, const char *unit);

/* SIGINT and SIGTERM in *mask_p, blocked when `block`: call it before any library thread
 * exists, so that they all inherit the mask and only the main thread takes them. -1, or
 * the failure's exit code (reported). */
int kvp_cli_stop_signals(sigset_t *mask_p, bool block);

/* All of buf to fd (EINTR retried); false with errno on failure. */
bool kvp_cli_write_all(int fd, const void *buf, size_t len);

/* A bounded char array from the library as a JSON string on stdout. */
void kvp_cli_json_string(const char *s, size_t cap);
/* A name (at most cap bytes of s) as a person should see it, in out (4 * cap + 3 bytes is
 * always room): as it is when it is printable ASCII with no space at either end; else in
 * double quotes with C escapes (\t, \n, \r, \xNN for other control bytes and non-ASCII,
 * \" and \\), so names that differ by a space, a tab or an invisible byte print apart. */
const char *kvp_cli_shown_name(const char *s, size_t cap, char *out, size_t out_cap);

#endif
