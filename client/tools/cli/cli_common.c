/*
 * cli_common.c - the helpers the kvpool command's files share: error and usage reports,
 * option and number parsing, connecting the client of the global options, progress,
 * signals and output.
 *
 * Design: built only on the public API of kvpool.h and on common/ (the size and
 * host:port parsers, min/max). Every report goes to stderr as "kvpool: ..." and returns
 * the exit status the command then returns, so a handler's error path is one line.
 *
 * Thread: the command's (main) thread only.
 */
#include "client/tools/cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/macros.h"

int kvp_cli_fail(const char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvpool: ", stderr);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, ": %s\n", why);
    va_end(ap);
    return KVP_CLI_FAIL;
}

int kvp_cli_usage_error(const kvp_cli_command_t *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvpool: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (cmd != NULL)
        fprintf(stderr, "usage: kvpool [GLOBAL OPTIONS] %s %s\n(see kvpool --help)\n", cmd->name,
                cmd->args);
    else
        kvp_cli_usage(stderr);
    return KVP_CLI_USAGE;
}

/* Report a getopt error ('?' or ':'), naming the option that caused it. */
static int option_error(const kvp_cli_command_t *cmd, int opt, int argc, char **argv)
{
    char shortopt[3] = {'-', (char)optopt, '\0'};
    const char *arg = argv[KVP_MAX(1, KVP_MIN(optind - 1, argc - 1))];
    const char *name = strncmp(arg, "--", 2) != 0 && optopt != 0 ? shortopt : arg;
    if (opt == ':')
        return kvp_cli_usage_error(cmd, "option '%s' needs an argument", name);
    return kvp_cli_usage_error(cmd, "unknown option '%s'", name);
}

int kvp_cli_option_other(const kvp_cli_command_t *cmd, int opt, int argc, char **argv)
{
    if (opt == 'h') {
        kvp_cli_usage(stdout);
        return KVP_CLI_OK;
    }
    return option_error(cmd, opt, argc, argv);
}

int kvp_cli_parse_no_options(const kvp_cli_command_t *cmd, int argc, char **argv)
{
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt = getopt_long(argc, argv, "+:h", opts, NULL);
    if (opt == -1)
        return -1;
    return kvp_cli_option_other(cmd, opt, argc, argv);
}

bool kvp_cli_parse_uint(const char *text, uint64_t max, uint64_t *value_p)
{
    if (text == NULL || text[0] < '0' || text[0] > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return false;
    *value_p = v;
    return true;
}

bool kvp_cli_parse_seconds(const char *text, double *value_p)
{
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || !(v >= 0) || v > 86400)
        return false;
    *value_p = v;
    return true;
}

const char *kvp_cli_why(kvp_status_t st)
{
    const char *le = kvp_client_last_error(); /* "OP: the master's reason" */
    const char *colon = strstr(le, ": ");
    return st == KVP_ERR_DENIED && colon != NULL ? colon + 2 : kvp_strerror(st);
}

/* Why create failed: the library's own sentence (a refused certificate or token), else st's. */
static const char *create_why(kvp_status_t st)
{
    const char *le = kvp_client_last_error();
    return strncmp(le, "create: ", 8) == 0 ? le + 8 : kvp_strerror(st);
}

const char *kvp_cli_read_token(const char *path)
{
    static char token[1024];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    size_t n = fread(token, 1, sizeof(token) - 1, f);
    bool more = fgetc(f) != EOF;
    fclose(f);
    while (n > 0 && (token[n - 1] == '\n' || token[n - 1] == '\r'))
        n--;
    token[n] = '\0';
    return n > 0 && !more ? token : NULL;
}

kvp_status_t kvp_cli_client_open(const kvp_cli_t *cli, kvp_client_params_t *params,
                                 kvp_client_t **client_p)
{
    kvp_client_params_t defaults;
    if (params == NULL) {
        kvp_client_params_init(&defaults);
        params = &defaults;
    }
    params->master_addr = cli->master;
    params->transport = cli->transport;
    params->rpc_timeout_ms = cli->timeout_ms;
    params->rdma_devices = cli->rdma_devices;
    params->rdma_host = cli->rdma_host;
    params->tls_cert = cli->tls_cert;
    params->tls_key = cli->tls_key;
    params->tls_ca = cli->tls_ca;
    params->token = cli->token;
    kvp_status_t status = kvp_client_create(params, client_p);
    if (status == KVP_ERR_CONNECT)
        fprintf(stderr,
                "kvpool: cannot reach master %s: %s\n"
                "kvpool: is kvpool-master running there? (set --master or $KVPOOL_MASTER)\n",
                cli->master, kvp_strerror(status));
    else if (status != KVP_OK)
        kvp_cli_fail(create_why(status), "cannot create a client for master %s", cli->master);
    return status;
}

bool kvp_cli_progress_wanted(const kvp_cli_t *cli, bool long_work)
{
    return cli->progress == KVP_CLI_PROGRESS_ALWAYS ||
           (cli->progress == KVP_CLI_PROGRESS_AUTO && long_work);
}

kvp_progress_t *kvp_cli_progress_start(const char *verb, const char *name, uint64_t total,
                                       bool bytes, const char *unit)
{
    char what[300];
    snprintf(what, sizeof(what), "%s %.*s", verb, 256, name);
    return kvp_progress_start(what, total, bytes, unit, KVP_PROGRESS_AUTO, 0);
}

int kvp_cli_stop_signals(sigset_t *mask_p, bool block)
{
    sigemptyset(mask_p);
    sigaddset(mask_p, SIGINT);
    sigaddset(mask_p, SIGTERM);
    if (!block)
        return -1;
    int err = pthread_sigmask(SIG_BLOCK, mask_p, NULL);
    if (err != 0)
        return kvp_cli_fail(strerror(err), "cannot block SIGINT/SIGTERM");
    return -1;
}

bool kvp_cli_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

const char *kvp_cli_shown_name(const char *s, size_t cap, char *out, size_t out_cap)
{
    size_t len = strnlen(s, cap), at = 1;
    bool quote = len == 0 || s[0] == ' ' || s[len - 1] == ' ';
    out[0] = '"';
    for (size_t i = 0; i < len && at + 6 < out_cap; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = c == '\t' ? "\\t" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : NULL;
        if (c == '"' || c == '\\') {
            out[at++] = '\\';
            out[at++] = (char)c;
        } else if (e != NULL) {
            memcpy(out + at, e, 2);
            at += 2;
        } else if (c < 0x20 || c >= 0x7f) {
            at += (size_t)snprintf(out + at, out_cap - at, "\\x%02x", c);
        } else {
            out[at++] = (char)c;
            continue;
        }
        quote = true;
    }
    if (!quote) { /* printable, no space at an end: as it is */
        snprintf(out, out_cap, "%.*s", (int)len, s);
        return out;
    }
    out[at++] = '"';
    out[at] = '\0';
    return out;
}

void kvp_cli_json_string(const char *s, size_t cap)
{
    putchar('"');
    for (size_t i = 0; i < cap && s[i] != '\0'; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}
