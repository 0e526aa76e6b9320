/*
 * main.c - the kvpool command-line tool: the global options, the command table and the
 * dispatch to a command (serve a segment, put, get and remove objects, test whether keys
 * exist, list keys, drain a segment, show pool statistics), and the usage text.
 *
 * Design: one process per command, built only on the public API of kvpool.h (plus the
 * parsers of common/). Global options are parsed with getopt_long("+") so parsing stops
 * at the command name; the command's handler (a row of `commands`, like git's builtin
 * table) then parses its own options from argv re-based at the command. Every command
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

static const char global_usage[] =
    "usage: kvpool [--master HOST:PORT] [--transport auto|tcp|shm|rdma] [--timeout-ms N]\n"
    "              [--progress | --no-progress] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  serve --segment-size SIZE [--ssd-path PATH --ssd-size SIZE] [--config FILE] ...\n"
    "                            mount a DRAM segment of SIZE (64MiB, 1g, 4096...) and/or\n"
    "                            an SSD segment and serve them until SIGINT or SIGTERM,\n"
    "                            then drain them: move their objects to other segments\n"
    "                            (its options: kvpool serve --help)\n"
    "  put [--replicas N] [--prefer SEGMENT] [--upsert] [--medium dram|ssd] KEY FILE|-\n"
    "                            store FILE (or stdin) under KEY (--upsert: replace)\n"
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
    "global options:\n"
    "  --master HOST:PORT        master address (default $KVPOOL_MASTER, "
    "else " KVP_CLI_DEFAULT_MASTER ");\n"
    "                            etcd://HOST:PORT[,HOST:PORT...]/CLUSTER: the leader of\n"
    "                            masters started with --etcd ... --cluster CLUSTER\n"
    "                            (etcd's TLS and user: $KVPOOL_ETCD_CACERT, _CERT, _KEY,\n"
    "                            _USER, _PASSWORD_FILE; docs/security.md)\n"
    "  --transport T             data transport: auto, tcp, shm or rdma (default auto:\n"
    "                            shm on one host, else rdma if both sides have it, else tcp)\n"
    "  --rdma-device LIST        RDMA devices to try, e.g. rxe0,mlx5_0 (default\n"
    "                            $KVPOOL_RDMA_DEVICE, else any with an active port)\n"
    "  --rdma-host IPV4          address serve's rdma listener binds and advertises\n"
    "                            (default $KVPOOL_RDMA_HOST, else the device's own)\n"
    "  --timeout-ms N            master RPC and transfer timeout\n"
    "  --tls-ca FILE             TLS 1.3 to the master, whose certificate FILE's CA signs\n"
    "                            (default $KVPOOL_TLS_CA; docs/security.md)\n"
    "  --tls-cert FILE, --tls-key FILE  our client certificate (mutual TLS; default\n"
    "                            $KVPOOL_TLS_CERT, $KVPOOL_TLS_KEY)\n"
    "  --token-file FILE         our principal's token, read from FILE (default\n"
    "                            $KVPOOL_TOKEN); sent over TLS only\n"
    "  --progress, --no-progress progress on stderr (a bar on a terminal, else a line\n"
    "                            every 2 s) always / never; default: for long work only\n"
    "                            (drain, removing many keys, objects of 32 MiB or more)\n"
    "  -h, --help, --version\n"
    "\n"
    "exit status: 0 success, 1 failure, 2 usage error\n";

/* The commands: name, group (the file that holds it), usage line, handler. */
static const kvp_cli_command_t commands[] = {
    {"serve", "serve",
     "--segment-size SIZE [--data-host HOST] [--data-port PORT] [--name NAME] "
     "[--ready-fd N] [--drain-timeout SECONDS] [--segment-file PATH [--segment-file-offset SIZE]] "
     "[--ssd-path PATH --ssd-size SIZE] "
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
    fputs(global_usage, out);
}

int kvp_cli_global_option(kvp_cli_t *cli, const kvp_cli_command_t *cmd, int opt, const char *arg)
{
    uint64_t v;
    switch (opt) {
    case KVP_CLI_OPT_MASTER:
        cli->master = arg;
        break;
    case KVP_CLI_OPT_TRANSPORT:
        if (strcmp(arg, "auto") != 0 && strcmp(arg, "tcp") != 0 && strcmp(arg, "shm") != 0 &&
            strcmp(arg, "rdma") != 0)
            return kvp_cli_usage_error(cmd, "--transport must be auto, tcp, shm or rdma, got '%s'",
                                       arg);
        cli->transport = arg;
        break;
    case KVP_CLI_OPT_RDMA_DEVICE:
        cli->rdma_devices = arg;
        break;
    case KVP_CLI_OPT_RDMA_HOST:
        cli->rdma_host = arg;
        break;
    case KVP_CLI_OPT_TIMEOUT:
        if (!kvp_cli_parse_uint(arg, UINT32_MAX, &v) || v == 0)
            return kvp_cli_usage_error(cmd, "--timeout-ms needs milliseconds >= 1, got '%s'", arg);
        cli->timeout_ms = (uint32_t)v;
        break;
    case KVP_CLI_OPT_TLS_CERT:
        cli->tls_cert = arg;
        break;
    case KVP_CLI_OPT_TLS_KEY:
        cli->tls_key = arg;
        break;
    case KVP_CLI_OPT_TLS_CA:
        cli->tls_ca = arg;
        break;
    case KVP_CLI_OPT_TOKEN_FILE:
        cli->token = kvp_cli_read_token(arg);
        if (cli->token == NULL)
            return kvp_cli_usage_error(cmd, "--token-file %s: cannot read a token from it", arg);
        break;
    case KVP_CLI_OPT_PROGRESS:
        cli->progress = KVP_CLI_PROGRESS_ALWAYS;
        break;
    case KVP_CLI_OPT_NO_PROGRESS:
        cli->progress = KVP_CLI_PROGRESS_NEVER;
        break;
    default:
        return KVP_CLI_USAGE; /* not a global option: never asked */
    }
    return -1;
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

/* Hidden global option: the library's environment as Markdown (docs/options.md). */
enum { CLI_OPT_ENV_MARKDOWN = 0x200 };

static int env_markdown(void)
{
    kvp_opts_t t = kvp_client_env_table(NULL);
    printf("## Client environment\n\nGenerated by `kvpool --env-markdown` from the table of "
           "client/env.c. libkvpool (and so the kvpool command, the Python module and kvpool "
           "serve) reads these variables once, when a client is created; a parameter of "
           "kvp_client_params_t (or a flag of the kvpool command) given explicitly wins over "
           "its variable, and an empty variable counts as unset.\n\n");
    kvp_opts_env_markdown(&t, stdout);
    return KVP_CLI_OK;
}

/* The global options before the command into *cli, the master's default filled in and
 * checked; -1, or the exit code when the process must stop now (--help, --version, a
 * usage error). */
static int parse_globals(kvp_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        KVP_CLI_GLOBAL_OPTIONS,
        {"progress", no_argument, NULL, KVP_CLI_OPT_PROGRESS},
        {"no-progress", no_argument, NULL, KVP_CLI_OPT_NO_PROGRESS},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, KVP_CLI_OPT_VERSION},
        {"env-markdown", no_argument, NULL, CLI_OPT_ENV_MARKDOWN}, /* hidden */
        {NULL, 0, NULL, 0},
    };
    const char *master_from = "--master";
    int opt;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (opt) {
        case KVP_CLI_OPT_VERSION:
            printf("kvpool " KVP_CLI_VERSION "\n");
            return KVP_CLI_OK;
        case CLI_OPT_ENV_MARKDOWN:
            return env_markdown();
        case 'h':
        case '?':
        case ':':
            return kvp_cli_option_other(NULL, opt, argc, argv);
        default: {
            int rc = kvp_cli_global_option(cli, NULL, opt, optarg);
            if (rc >= 0)
                return rc;
            cli->given |= 1u << (opt - KVP_CLI_OPT_MASTER);
            break;
        }
        }
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
