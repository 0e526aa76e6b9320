/*
 * options.h - one row per option: the tables the daemons (kvpool-master, kvpool serve)
 * declare their settings in, and what is made from them (see options.c).
 *
 * A row names a setting once: its long flag (which is also its config-file key,
 * common/conf.h), an optional short flag, its type, its default, the field it is read
 * into (an offset into the daemon's own struct), an optional environment variable and
 * its help. From the table come the getopt_long entries, the parsing of a value (from a
 * flag, a config-file key, or the environment), the defaults, the --help text and the
 * Markdown table of docs/options.md. Modelled on redis's config.c (createBoolConfig(...)
 * rows) and UCX's config tables.
 *
 *   static const kvp_opt_t rows[] = {
 *       KVP_OPT_GROUP("Eviction"),
 *       {.name = "lease-ttl", .type = KVP_OPT_SECONDS_MS, .arg = "SECONDS", .def = "5",
 *        KVP_OPT_FIELD(my_config_t, lease_ttl_ms), .help = "..."},
 *   };
 *
 * Thread: any; no state besides the caller's (the parser's getopt state is getopt's).
 */
#ifndef KVP_COMMON_OPTIONS_H
#define KVP_COMMON_OPTIONS_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

/* How a value is read and where it is stored (`size`: the field's size, KVP_OPT_FIELD). */
typedef enum kvp_opt_type {
    KVP_OPT_GROUP,      /* not an option: a heading of the usage text and the docs */
    KVP_OPT_ACTION,     /* no field: the caller acts on it (--help); takes an argument
                         * only when `arg` names one (--config FILE, which common/conf.c
                         * reads before getopt does) */
    KVP_OPT_SET_TRUE,   /* no argument: the field (bool, or an unsigned integer) becomes
                         * true ("--lease-on-exist") */
    KVP_OPT_SET_FALSE,  /* no argument: the bool field becomes false ("--no-eviction");
                         * for both, `def` is the field's own default, "on" or "off" */
    KVP_OPT_ON_OFF,     /* "on" or "off" into a bool (or unsigned integer) field */
    KVP_OPT_FRACTION,   /* double field, 0..1 */
    KVP_OPT_SECONDS_MS, /* uint32_t milliseconds, given in seconds (fractions allowed) */
    KVP_OPT_SECONDS,    /* uint32_t whole seconds (a fraction is cut) */
    KVP_OPT_SECONDS_F,  /* double seconds */
    KVP_OPT_UINT,       /* unsigned integer field of 1, 2, 4 or 8 bytes, min..max */
    KVP_OPT_INT,        /* int field, min..max */
    KVP_OPT_SIZE,       /* uint64_t bytes: "64MiB", "1g", "4096" (kvp_parse_size), min.. */
    KVP_OPT_STRING,     /* char[size] (a copy), or const char * (size == sizeof(char *)
                         * and KVP_OPT_F_PTR: the value itself, borrowed) */
    KVP_OPT_HOSTPORT,   /* a STRING that must be HOST:PORT */
    KVP_OPT_ENUM,       /* a STRING that must be one of `choices` */
    KVP_OPT_CUSTOM,     /* `parse` reads it */
} kvp_opt_type_t;

/* Row flags. */
enum {
    KVP_OPT_F_PTR = 1u << 0,            /* STRING/HOSTPORT/ENUM: a const char * field, borrowed */
    KVP_OPT_F_HIDDEN = 1u << 1,         /* not in --help nor the docs (--options-markdown) */
    KVP_OPT_F_ENV_LAX = 1u << 2,        /* a bad value of the environment variable is ignored */
    KVP_OPT_F_NONEMPTY = 1u << 3,       /* STRING: "" is refused */
    KVP_OPT_F_READ_ELSEWHERE = 1u << 4, /* an environment variable documented here but read
                                         * where its setting lives: kvp_opts_env skips it */
};

typedef struct kvp_opt kvp_opt_t;

/* A CUSTOM row's reader: `value` into `field` (the row's field in the caller's struct);
 * KVP_ERR_INVALID_ARG with a sentence in err on a bad value. */
typedef kvp_status_t (*kvp_opt_parse_cb_t)(const kvp_opt_t *opt, const char *value, void *field,
                                           char *err, size_t err_len);

struct kvp_opt {
    const char *name; /* the long flag without "--", also the config-file key */
    int short_flag;   /* 0: none */
    kvp_opt_type_t type;
    unsigned flags;             /* KVP_OPT_F_* */
    const char *arg;            /* the argument's name in --help ("HOST:PORT"); NULL: the type's */
    const char *def;            /* the default as a value (applied by kvp_opts_defaults, read like
                                 * a flag's value but not range-checked: "-1" may mean "none");
                                 * NULL: the field is left as the caller initialised it */
    const char *def_doc;        /* the default as the docs say it when `def` cannot ("the
                                 * --listen address as bound"); NULL: `def`, else none */
    size_t offset;              /* of the field in the caller's struct (KVP_OPT_FIELD) */
    size_t size;                /* of the field */
    int64_t min, max;           /* UINT, INT, SIZE (for SIZE, max 0: none) */
    const char *const *choices; /* ENUM: NULL-terminated */
    const char *env;            /* environment variable read by kvp_opts_env; NULL: none */
    const char *need;           /* what a bad value is told it needs ("a size such as
                                 * 64MiB"): "--NAME needs NEED, got 'VALUE'"; NULL: the
                                 * type's own sentence */
    kvp_opt_parse_cb_t parse;   /* CUSTOM */
    const char *help;           /* one paragraph; --help and the docs wrap it (GROUP: the
                                 * heading) */
    const char *intro;          /* GROUP: a sentence under the heading; NULL: none */
};

/* The field of a row: .offset and .size of `field` in `type`. */
#define KVP_OPT_FIELD(type, field)                                                                 \
    .offset = offsetof(type, field), .size = sizeof(((type *)0)->field)
/* A heading of the usage text and of the docs table. */
#define KVP_OPT_GROUP(title, text)                                                                 \
    {                                                                                              \
        .type = KVP_OPT_GROUP, .help = (title), .intro = (text)                                    \
    }

/* The rows every daemon has: --ready-fd N and --log-level into int fields of `cfg_t`
 * (env: the log level's environment variable), --help, --version and the hidden
 * --options-markdown (KVP_OPT_ACTION: the daemon acts on them). */
#define KVP_OPT_ROW_READY_FD(cfg_t, field)                                                         \
    {                                                                                              \
        .name = "ready-fd", .type = KVP_OPT_INT, .arg = "N", .def = "-1", .def_doc = "none",       \
        KVP_OPT_FIELD(cfg_t, field), .min = 0, .max = 65535, .need = "a file descriptor number",   \
        .help = "write the bound HOST:PORT and a newline to fd N when listening, then close it"    \
    }
#define KVP_OPT_ROW_LOG_LEVEL(cfg_t, field, envvar)                                                \
    {                                                                                              \
        .name = "log-level", .type = KVP_OPT_CUSTOM, .flags = KVP_OPT_F_ENV_LAX,                   \
        .arg = "off|error|warn|info|debug", .def = "info", KVP_OPT_FIELD(cfg_t, field),            \
        .env = (envvar), .parse = kvp_opt_parse_log_level,                                         \
        .help = "what goes to stderr (an unknown value of the environment variable is ignored)"    \
    }
#define KVP_OPT_ROWS_ACTIONS                                                                       \
    {.name = "help", .short_flag = 'h', .type = KVP_OPT_ACTION, .help = "this text"},              \
        {.name = "version", .type = KVP_OPT_ACTION, .help = "the version"},                        \
    {                                                                                              \
        .name = "options-markdown", .type = KVP_OPT_ACTION, .flags = KVP_OPT_F_HIDDEN,             \
        .help = "these options as Markdown tables (docs/options.md)"                               \
    }

/* A table and the struct its rows' fields are in. */
typedef struct kvp_opts {
    const kvp_opt_t *rows;
    size_t count;
    void *base;
} kvp_opts_t;

/* The row named `name` (a long flag) in `opts`; NULL: none. */
const kvp_opt_t *kvp_opts_find(const kvp_opts_t *opts, const char *name);

/* Every row's default (its `def`) into its field; KVP_ERR_INVALID_ARG when a default does
 * not parse (a bug in the table), with the sentence in err. */
kvp_status_t kvp_opts_defaults(const kvp_opts_t *opts, char *err, size_t err_len);

/* Read `value` (NULL for a row that takes none) into the row's field of `base`. A bad
 * value is KVP_ERR_INVALID_ARG with a sentence in err. Thread: any. */
kvp_status_t kvp_opt_set(const kvp_opt_t *opt, void *base, const char *value, char *err,
                         size_t err_len);

/* Every row's environment variable that is set and not empty, read like its flag (a bad
 * value: KVP_ERR_INVALID_ARG, "$VAR: ..." in err, unless the row is KVP_OPT_F_ENV_LAX).
 * Call it after kvp_opts_defaults and before the flags, so flags override it. */
kvp_status_t kvp_opts_env(const kvp_opts_t *opts, char *err, size_t err_len);

/*
 * The getopt_long entries of the tables `sets[0..nsets)` into out[0..cap), then a zero
 * entry; `extra` (NULL-terminated by a zero entry; may be NULL) appended before it. A row's
 * getopt value is its short flag, or KVP_OPT_VAL(set, index) (which kvp_opts_lookup
 * reads back). The short options (with ':' after those that take an argument) into
 * shortopts[0..short_len), after `short_prefix` ("+:h", "h"). Returns the number of
 * entries written, or 0 when out or shortopts is too small.
 */
size_t kvp_opts_getopt(const kvp_opts_t *sets, size_t nsets, const struct option *extra,
                       struct option *out, size_t cap, const char *short_prefix, char *shortopts,
                       size_t short_len);
#define KVP_OPT_VAL_BASE 0x10000
#define KVP_OPT_VAL(set, index) (KVP_OPT_VAL_BASE + ((int)(set) << 12) + (int)(index))

/* The row getopt_long's return value `val` stands for: its table in *set_p; NULL when it is
 * none of theirs (an `extra` entry, '?', ':'). */
const kvp_opt_t *kvp_opts_lookup(const kvp_opts_t *sets, size_t nsets, int val, size_t *set_p);

/* The usage lines of the rows on f: "  -x, --name ARG   help..." wrapped at 79 columns, the
 * help from column `col`; a GROUP row is its heading line. Hidden rows are left out. */
void kvp_opts_usage(const kvp_opts_t *opts, size_t col, FILE *f);

/* The rows as Markdown tables on f, one per group (a GROUP row starts a "### " heading):
 * flag, short, type, default, config key, environment variable, description. */
void kvp_opts_markdown(const kvp_opts_t *opts, FILE *f);

/* The rows' environment variables as Markdown tables on f, one per group: variable, type,
 * default, description (rows without a variable are left out). */
void kvp_opts_env_markdown(const kvp_opts_t *opts, FILE *f);

/* A CUSTOM row's reader of a log level, off|error|warn|info|debug in any case, into an int
 * field (a kvp_log_level_t): the daemons' --log-level. */
kvp_status_t kvp_opt_parse_log_level(const kvp_opt_t *opt, const char *value, void *field,
                                     char *err, size_t err_len);

/* A row's type in words ("seconds", "size", "on|off"), as --help and the docs show it. */
const char *kvp_opt_type_name(const kvp_opt_t *opt);

#endif
