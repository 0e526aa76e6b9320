/*
 * main.c - the kvpool command-line tool: the global options, the command table and the
 * dispatch to a command (serve a segment, put, get and remove objects, test whether keys
 * exist, list keys, drain a segment, show pool statistics), and the usage text.
 *
 * Design: one process per command, built only on the public API of kvpool.h (plus the
 * parsers and the option tables of common/). The global options are the rows of two
 * tables (common/options.h): global_rows, which kvpool serve also takes after its name and
 * in its config file, and cli_rows, the command's alone; their getopt entries, the global
 * part of --help and docs/options.md's section (--options-markdown) come from the rows.
 * They are parsed with getopt_long("+") so parsing stops at the command name; the
 * command's handler (a row of `commands`, like git's builtin table) then parses its own
 * options from argv re-based at the command. Every command
 * checks all of its input (numbers, sizes, files, fds) before it connects, so a usage
 * mistake is reported at once and never waits on the master. The commands live one
 * group per file: cli_object.c (put, get, exist, rm, ls), cli_admin.c (drain, stat, rm --regex
 * and --all), serve.c (serve); cli_common.c holds what they share.
 *
 * Exit status: see cli.h.
 *
 * Thread: single-threaded; the library runs its own threads.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "client/env.h"
#include "client/tools/cli/cli.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/parse.h"

#define KVP_CLI_VERSION "0.1.0"
#define KVP_CLI_STR_(x) #x
#define KVP_CLI_STR(x) KVP_CLI_STR_(x)
#define KVP_CLI_DEFAULT_MASTER "127.0.0.1:" KVP_CLI_STR(KVP_DEFAULT_MASTER_PORT)

static const char usage_head[] =
    "usage: kvpool [--master HOST:PORT] [--transport auto|tcp|shm|rdma] [--timeout-ms N]\n"
    "              [--progress | --no-progress] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  serve --segment-size SIZE [--ssd-path PATH --ssd-size SIZE] [--config FILE] ...\n"
    "                            mount a DRAM segment of SIZE (64MiB, 1g, 4096...) and/or\n"
    "                            an SSD segment and serve them until SIGINT or SIGTERM,\n"
    "                            then drain them: move their objects to other segments\n"
    "                            (its options: kvpool serve --help)\n"
    "  put [--replicas N] [--prefer SEGMENT] [--upsert] [--medium dram|ssd] [--dfs] KEY FILE|-\n"
    "                            store FILE (or stdin) under KEY (--upsert: replace;\n"
    "                            --dfs: also a replica on a DFS segment)\n"
    "  get KEY [FILE|-]          write the object to FILE (default: stdout)\n"
    "  exist KEY...              print KEY<TAB>yes|no; exit 0 if all exist, 1 if not\n"
    "  rm [--force] KEY...       remove objects (--force: also ones being read)\n"
    "  rm [--force] --regex RE | --all\n"
    "                            remove every object whose key matches the POSIX\n"
    "                            extended regex RE, or every object\n"
    "  ls [--limit N] [--json] [RE]\n"
    "                            keys (matching RE), sizes, replicas, lease, pin\n"
    "                            (at most N, default 1000)\n"
    "  drain [--wait SECONDS] SEGMENT\n"
    "                            ask SEGMENT's owner to move its objects elsewhere and\n"
    "                            unmount; wait for it (default 60 s)\n"
    "  stat [--json] [--watch [SECONDS]]\n"
    "                            pool capacity, usage and segments; --watch: again every\n"
    "                            SECONDS (default 1) until Ctrl-C\n"
    "\n"
    "global options, before the command:\n";

/* --transport: one of the library's transports (the value itself, borrowed). */
static kvp_status_t parse_transport(const kvp_opt_t *opt, const char *value, void *field, char *err,
                                    size_t err_len)
{
    if (strcmp(value, "auto") != 0 && strcmp(value, "tcp") != 0 && strcmp(value, "shm") != 0 &&
        strcmp(value, "rdma") != 0) {
        snprintf(err, err_len, "--%s must be auto, tcp, shm or rdma, got '%s'", opt->name, value);
        return KVP_ERR_INVALID_ARG;
    }
    *(const char **)field = value;
    return KVP_OK;
}

/* --token-file: the token read from the file (kvp_cli_read_token's static buffer). */
static kvp_status_t parse_token_file(const kvp_opt_t *opt, const char *value, void *field,
                                     char *err, size_t err_len)
{
    const char *token = kvp_cli_read_token(value);
    if (token == NULL) {
        snprintf(err, err_len, "--%s %s: cannot read a token from it", opt->name, value);
        return KVP_ERR_INVALID_ARG;
    }
    *(const char **)field = token;
    return KVP_OK;
}

#define F(field) KVP_OPT_FIELD(kvp_cli_t, field)
/* The variable is read where the setting lives: KVPOOL_MASTER by parse_globals (through
 * client/env.c), the others by the library when the flag leaves its parameter NULL. */
#define ENV_STR (KVP_OPT_F_PTR | KVP_OPT_F_READ_ELSEWHERE)

/* The global options that every command runs under and that `kvpool serve` also takes
 * after its name and as keys of its config file; one row each (common/options.h), over a
 * kvp_cli_t. A row's index is its bit in kvp_cli_t.given. */
static const kvp_opt_t global_rows[] = {
    KVP_OPT_GROUP("The master and the data path", NULL),
    {.name = "master",
     .type = KVP_OPT_STRING,
     .flags = ENV_STR,
     .arg = "HOST:PORT",
     F(master),
     .def_doc = KVP_CLI_DEFAULT_MASTER,
     .env = "KVPOOL_MASTER",
     .help = "the master's address; etcd://HOST:PORT[,HOST:PORT...]/CLUSTER: the leader of "
             "masters started with --etcd ... --cluster CLUSTER (etcd's TLS and user: "
             "$KVPOOL_ETCD_CACERT, _CERT, _KEY, _USER, _PASSWORD_FILE; docs/security.md)"},
    {.name = "transport",
     .type = KVP_OPT_CUSTOM,
     .flags = KVP_OPT_F_READ_ELSEWHERE,
     .arg = "auto|tcp|shm|rdma",
     F(transport),
     .parse = parse_transport,
     .def_doc = "auto",
     .env = "KVPOOL_TRANSPORT",
     .help = "the data transport; auto: shm on one host, else rdma if both sides have it, "
             "else tcp"},
    {.name = "timeout-ms",
     .type = KVP_OPT_UINT,
     F(timeout_ms),
     .min = 1,
     .max = UINT32_MAX,
     .need = "milliseconds >= 1",
     .def_doc = "10000",
     .help = "the master RPC and data transfer timeout, in milliseconds"},
    {.name = "rdma-device",
     .type = KVP_OPT_STRING,
     .flags = ENV_STR,
     .arg = "LIST",
     F(rdma_devices),
     .def_doc = "any with an active port",
     .env = "KVPOOL_RDMA_DEVICE",
     .help = "the RDMA devices to try, e.g. rxe0,mlx5_0"},
    {.name = "rdma-host",
     .type = KVP_OPT_STRING,
     .flags = ENV_STR,
     .arg = "IPV4",
     F(rdma_host),
     .def_doc = "the device's own",
     .env = "KVPOOL_RDMA_HOST",
     .help = "the address serve's rdma listener binds and advertises"},

    KVP_OPT_GROUP("Security", "TLS to the master and our principal; docs/security.md"),
    {.name = "tls-ca",
     .type = KVP_OPT_STRING,
     .flags = ENV_STR,
     .arg = "FILE",
     F(tls_ca),
     .def_doc = "none: plain TCP",
     .env = "KVPOOL_TLS_CA",
     .help = "TLS 1.3 to the master, whose certificate FILE's CA signs"},
    {.name = "tls-cert",
     .type = KVP_OPT_STRING,
     .flags = ENV_STR,
     .arg = "FILE",
     F(tls_cert),
     .env = "KVPOOL_TLS_CERT",
     .help = "our client certificate (mutual TLS)"},
    {.name = "tls-key",
     .type = KVP_OPT_STRING,
     .flags = ENV_STR,
     .arg = "FILE",
     F(tls_key),
     .env = "KVPOOL_TLS_KEY",
     .help = "the key of --tls-cert"},
    {.name = "token-file",
     .type = KVP_OPT_CUSTOM,
     .flags = KVP_OPT_F_READ_ELSEWHERE,
     .arg = "FILE",
     F(token),
     .parse = parse_token_file,
     .env = "KVPOOL_TOKEN",
     .help = "our principal's token, read from FILE (never a flag: ps would show it; the "
             "variable holds the token itself); sent over TLS only"},
};
#undef F

/* The global options of the kvpool command alone (before the command; no config key):
 * acted on by parse_globals. */
static const kvp_opt_t cli_rows[] = {
    KVP_OPT_GROUP("The kvpool command alone",
                  "before the command only: not after `serve` nor in its config file"),
    {.name = "progress",
     .type = KVP_OPT_ACTION,
     .help = "progress on stderr (a bar on a terminal, else a line every 2 s) always; "
             "default: for long work only (drain, removing many keys, objects of 32 MiB or "
             "more)"},
    {.name = "no-progress", .type = KVP_OPT_ACTION, .help = "no progress on stderr"},
    {.name = "help", .short_flag = 'h', .type = KVP_OPT_ACTION, .help = "this text"},
    {.name = "version", .type = KVP_OPT_ACTION, .help = "the version"},
    {.name = "env-markdown",
     .type = KVP_OPT_ACTION,
     .flags = KVP_OPT_F_HIDDEN,
     .help = "the library's environment as Markdown tables (docs/options.md)"},
    {.name = "options-markdown",
     .type = KVP_OPT_ACTION,
     .flags = KVP_OPT_F_HIDDEN,
     .help = "these options as Markdown tables (docs/options.md)"},
};

_Static_assert(KVP_ARRAY_SIZE(global_rows) <= 32, "kvp_cli_t.given has a bit per row");

kvp_opts_t kvp_cli_global_opts(kvp_cli_t *cli)
{
    return (kvp_opts_t){.rows = global_rows, .count = KVP_ARRAY_SIZE(global_rows), .base = cli};
}

static kvp_opts_t cli_opts(void)
{
    return (kvp_opts_t){.rows = cli_rows, .count = KVP_ARRAY_SIZE(cli_rows), .base = NULL};
}

/* The commands: name, group (the file that holds it), usage line, handler. */
static const kvp_cli_command_t commands[] = {
    {"serve", "serve",
     "--segment-size SIZE [--data-host HOST] [--data-port PORT] [--name NAME] "
     "[--ready-fd N] [--drain-timeout SECONDS] [--segment-file PATH [--segment-file-offset SIZE]] "
     "[--ssd-path PATH --ssd-size SIZE] [--dfs-path DIR [--dfs-size SIZE]] "
     "[--http-listen HOST:PORT] [--auth protected|none] [--tenant T] "
     "[--rdma-windows on|unbounded|off] [--config FILE]",
     kvp_cli_serve},
    {"put", "object", "[--replicas N] [--prefer SEGMENT] [--upsert] KEY FILE|-", kvp_cli_put},
    {"get", "object", "KEY [FILE|-]", kvp_cli_get},
    {"exist", "object", "KEY...", kvp_cli_exist},
    {"rm", "object", "[--force] KEY... | [--force] --regex RE | [--force] --all", kvp_cli_rm},
    {"ls", "object", "[--limit N] [--json] [RE]", kvp_cli_ls},
    {"drain", "admin", "[--wait SECONDS] SEGMENT", kvp_cli_drain},
    {"stat", "admin", "[--json] [--watch [SECONDS]]", kvp_cli_stat},
};

void kvp_cli_usage(FILE *out)
{
    fputs(usage_head, out);
    kvp_opts_t globals = kvp_cli_global_opts(NULL), own = cli_opts();
    kvp_opts_usage(&globals, 28, out);
    kvp_opts_usage(&own, 28, out);
    fputs("\nexit status: 0 success, 1 failure, 2 usage error\n", out);
}

int kvp_cli_global_set(kvp_cli_t *cli, const kvp_cli_command_t *cmd, const kvp_opt_t *row,
                       const char *arg)
{
    char err[4352]; /* a path of PATH_MAX bytes and a sentence */
    if (kvp_opt_set(row, cli, arg, err, sizeof(err)) != KVP_OK)
        return kvp_cli_usage_error(cmd, "%s", err);
    return -1;
}

bool kvp_cli_global_given(const kvp_cli_t *cli, const kvp_opt_t *row)
{
    return (cli->given & (1u << (row - global_rows))) != 0;
}

int kvp_cli_check_master(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, const char *from)
{
    char host[256];
    uint16_t port;
    if (strncmp(cli->master, "etcd://", 7) != 0 && /* the leader, found in etcd */
        kvp_parse_hostport(cli->master, host, sizeof(host), &port) != KVP_OK)
        return kvp_cli_usage_error(cmd,
                                   "%s needs HOST:PORT or etcd://HOST:PORT[,...]/CLUSTER, got '%s'",
                                   from, cli->master);
    return -1;
}

/* kvpool --env-markdown: the library's environment as Markdown (docs/options.md). */
static int env_markdown(void)
{
    kvp_opts_t t = kvp_client_env_table(NULL);
    printf("## Client environment\n\nGenerated by `kvpool --env-markdown` from the table of "
           "client/env.c. libkvpool (and so the kvpool command, the Python module and kvpool "
           "serve) reads these variables once, when a client is created; a parameter of "
           "kvp_client_params_t (or a flag of the kvpool command) given explicitly wins over "
           "its variable, and an empty variable counts as unset.\n\n");
    kvp_opts_env_markdown(&t, stdout);
    /* the transfer engine's own, typed: a bad value fails the engine's creation */
    kvp_opts_t te = kvp_te_env_table(NULL);
    printf("\n");
    kvp_opts_env_markdown(&te, stdout);
    return KVP_CLI_OK;
}

/* kvpool --options-markdown: the global options as Markdown (docs/options.md). */
static int options_markdown(void)
{
    kvp_opts_t globals = kvp_cli_global_opts(NULL), own = cli_opts();
    printf("## Global options (every command, `kvpool serve` included)\n\nGenerated by "
           "`kvpool --options-markdown` from the option tables (client/tools/cli/main.c). "
           "Every command takes these before its name. `kvpool serve` also takes those with a "
           "config key after `serve` and as keys of the file that `--config FILE` reads; the "
           "same option given before `serve` wins over both. An environment variable named "
           "here is read when the flag is not given (see Client environment; "
           "`KVPOOL_TOKEN` holds the token itself). The kvpool command logs the library's "
           "warnings on stderr (`KVPOOL_LOG_LEVEL` overrides).\n\n");
    kvp_opts_markdown(&globals, stdout);
    putchar('\n');
    kvp_opts_markdown(&own, stdout);
    return KVP_CLI_OK;
}

/* One of cli_rows: -1, or the exit code when the process must stop now. */
static int global_action(kvp_cli_t *cli, const kvp_opt_t *row, int argc, char **argv)
{
    if (strcmp(row->name, "progress") == 0) {
        cli->progress = KVP_CLI_PROGRESS_ALWAYS;
        return -1;
    }
    if (strcmp(row->name, "no-progress") == 0) {
        cli->progress = KVP_CLI_PROGRESS_NEVER;
        return -1;
    }
    if (strcmp(row->name, "version") == 0) {
        printf("kvpool " KVP_CLI_VERSION "\n");
        return KVP_CLI_OK;
    }
    if (strcmp(row->name, "env-markdown") == 0)
        return env_markdown();
    if (strcmp(row->name, "options-markdown") == 0)
        return options_markdown();
    return kvp_cli_option_other(NULL, 'h', argc, argv); /* help */
}

/* The global options before the command into *cli, the master's default filled in and
 * checked; -1, or the exit code when the process must stop now (--help, --version, a
 * usage error). */
static int parse_globals(kvp_cli_t *cli, int argc, char **argv)
{
    const kvp_opts_t sets[] = {kvp_cli_global_opts(cli), cli_opts()};
    struct option opts[32];
    char shortopts[16];
    if (kvp_opts_getopt(sets, KVP_ARRAY_SIZE(sets), NULL, opts, KVP_ARRAY_SIZE(opts),
                        "+:", shortopts, sizeof(shortopts)) == 0)
        return kvp_cli_fail("too many options", "the global option table");
    const char *master_from = "--master";
    int opt;
    while ((opt = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
        size_t set = 0;
        const kvp_opt_t *row = kvp_opts_lookup(sets, KVP_ARRAY_SIZE(sets), opt, &set);
        int rc = row == NULL ? kvp_cli_option_other(NULL, opt, argc, argv) /* '?', ':' */
                 : set == 1  ? global_action(cli, row, argc, argv)
                             : kvp_cli_global_set(cli, NULL, row, optarg);
        if (rc >= 0)
            return rc;
        if (set == 0)
            cli->given |= 1u << (row - global_rows);
    }
    if (cli->master == NULL) {
        kvp_client_env_t env; /* the library's reading of KVPOOL_MASTER (client/env.c) */
        kvp_client_env_read(&env);
        master_from = "$KVPOOL_MASTER";
        cli->master = env.master != NULL ? env.master : KVP_CLI_DEFAULT_MASTER;
    }
    return kvp_cli_check_master(cli, NULL, master_from);
}

int main(int argc, char **argv)
{
    kvp_cli_t cli = {0};

    /* A closed stdout or ready pipe must be an error we report, not a silent death. */
    signal(SIGPIPE, SIG_IGN);
    /* the library is silent by default; a CLI user wants its warnings (e.g. the master's
     * account of what holds a full pool) next to the error ($KVPOOL_LOG_LEVEL overrides) */
    if (!kvp_log_init_from_env())
        kvp_log_set_level(KVP_LOG_WARN);
    int rc = parse_globals(&cli, argc, argv);
    if (rc >= 0)
        return rc;

    if (optind >= argc)
        return kvp_cli_usage_error(NULL, "no command given");
    const char *name = argv[optind];
    for (size_t i = 0; i < KVP_ARRAY_SIZE(commands); i++) {
        if (strcmp(name, commands[i].name) == 0) {
            int cargc = argc - optind;
            char **cargv = argv + optind;
            optind = 0; /* glibc: re-initialise getopt for the command's argv */
            return commands[i].run(&cli, &commands[i], cargc, cargv);
        }
    }
    if (strcmp(name, "help") == 0) {
        kvp_cli_usage(stdout);
        return KVP_CLI_OK;
    }
    return kvp_cli_usage_error(NULL, "unknown command '%s'", name);
}
