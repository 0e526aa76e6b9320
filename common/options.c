/*
 * options.c - one row per option (see options.h): reading a value into a row's field,
 * the defaults, the environment, the getopt_long entries, the usage text and the
 * Markdown docs, all from the same rows.
 *
 * Design: a row is data; the code here is one switch per use (read, name, describe) over
 * the row's type. A row's field is found by its offset in the caller's struct and stored
 * by its size, so a table can describe any struct; a value is checked the same way
 * whether it comes from a flag, a config-file key (common/conf.c turns keys into flags)
 * or the environment.
 *
 * Thread: any; no state of its own.
 */
#include "common/options.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/macros.h"
#include "common/parse.h"

#define YEAR_S (86400.0 * 365)
#define WIDTH 79

static const char *choices_text(const kvp_opt_t *o, char *buf, size_t len);

/* "--NAME needs WHAT, got 'VALUE'"; WHAT: what the row says it needs, else `what`. */
static kvp_status_t bad_value(const kvp_opt_t *o, const char *value, char *err, size_t err_len,
                              const char *what)
{
    snprintf(err, err_len, "--%s needs %s, got '%s'", o->name, o->need != NULL ? o->need : what,
             value);
    return KVP_ERR_INVALID_ARG;
}

/* A decimal integer, all of text, in [min, max]. */
static bool parse_int(const char *text, bool is_signed, int64_t min, int64_t max, int64_t *v_p)
{
    if (text == NULL || !((text[0] >= '0' && text[0] <= '9') || (is_signed && text[0] == '-')))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return false;
    *v_p = v;
    return true;
}

/* Store v in an unsigned field of `size` bytes. */
static void store_uint(void *field, size_t size, uint64_t v)
{
    if (size == 1)
        *(uint8_t *)field = (uint8_t)v;
    else if (size == 2)
        *(uint16_t *)field = (uint16_t)v;
    else if (size == 4)
        *(uint32_t *)field = (uint32_t)v;
    else
        *(uint64_t *)field = v;
}

/* The seconds types: strtod, all of text, 0..max (max 0: a year). */
static kvp_status_t set_seconds(const kvp_opt_t *o, void *field, const char *value, bool check,
                                char *err, size_t err_len)
{
    char *end;
    double v = strtod(value, &end);
    double max = o->max > 0 ? (double)o->max : YEAR_S;
    if (*end != '\0' || end == value || !(v >= 0) || (check && (v > max || v < (double)o->min))) {
        if (o->need != NULL)
            return bad_value(o, value, err, err_len, NULL);
        snprintf(err, err_len, "bad value '%s' for a time in seconds", value);
        return KVP_ERR_INVALID_ARG;
    }
    if (o->type == KVP_OPT_SECONDS_MS)
        *(uint32_t *)field = (uint32_t)(v * 1000);
    else if (o->type == KVP_OPT_SECONDS)
        *(uint32_t *)field = (uint32_t)v;
    else
        *(double *)field = v;
    return KVP_OK;
}

/* The string types: checked, then copied (char[size]) or pointed to (KVP_OPT_F_PTR). */
static kvp_status_t set_string(const kvp_opt_t *o, void *field, const char *value, char *err,
                               size_t err_len)
{
    size_t len = strlen(value);
    if (o->type == KVP_OPT_HOSTPORT) {
        char host[256];
        uint16_t port;
        if (kvp_parse_hostport(value, host, sizeof(host), &port) != KVP_OK)
            return bad_value(o, value, err, err_len, "HOST:PORT");
    } else if (o->type == KVP_OPT_ENUM) {
        size_t i = 0;
        while (o->choices[i] != NULL && strcmp(o->choices[i], value) != 0)
            i++;
        if (o->choices[i] == NULL) {
            char list[256], what[300];
            snprintf(what, sizeof(what), "one of %s", choices_text(o, list, sizeof(list)));
            return bad_value(o, value, err, err_len, what);
        }
    }
    bool ptr = (o->flags & KVP_OPT_F_PTR) != 0;
    size_t max = ptr ? SIZE_MAX : o->size - 1; /* a copy: what fits */
    if (o->max > 0 && (size_t)o->max < max)
        max = (size_t)o->max;
    if (((!ptr || (o->flags & KVP_OPT_F_NONEMPTY)) && len == 0) || len > max) {
        if (o->need != NULL)
            return bad_value(o, value, err, err_len, NULL);
        snprintf(err, err_len, "--%s needs a value of 1..%zu bytes", o->name, max);
        return KVP_ERR_INVALID_ARG;
    }
    if (ptr)
        *(const char **)field = value;
    else
        memcpy(field, value, len + 1);
    return KVP_OK;
}

/* Read value into the field; check: the range is checked (not for a default). */
static kvp_status_t opt_set(const kvp_opt_t *o, void *base, const char *value, bool check,
                            char *err, size_t err_len)
{
    void *field = (char *)base + o->offset;
    int64_t v;
    uint64_t bytes;
    switch (o->type) {
    case KVP_OPT_GROUP:
    case KVP_OPT_ACTION:
        return KVP_OK;
    case KVP_OPT_SET_TRUE:
    case KVP_OPT_SET_FALSE:
        /* a value only as the field's default ("on", "off"): a flag has none */
        store_uint(field, o->size,
                   value != NULL ? strcmp(value, "on") == 0 : o->type == KVP_OPT_SET_TRUE);
        return KVP_OK;
    case KVP_OPT_ON_OFF:
        if (strcmp(value, "on") != 0 && strcmp(value, "off") != 0) {
            snprintf(err, err_len, "bad value '%s' for %s (on or off)", value, o->name);
            return KVP_ERR_INVALID_ARG;
        }
        store_uint(field, o->size, strcmp(value, "on") == 0);
        return KVP_OK;
    case KVP_OPT_FRACTION: {
        char *end;
        double d = strtod(value, &end);
        if (*end != '\0' || end == value || !(d >= 0) || d > 1) {
            snprintf(err, err_len, "bad value '%s' for a watermark (0..1)", value);
            return KVP_ERR_INVALID_ARG;
        }
        *(double *)field = d;
        return KVP_OK;
    }
    case KVP_OPT_SECONDS_MS:
    case KVP_OPT_SECONDS:
    case KVP_OPT_SECONDS_F:
        return set_seconds(o, field, value, check, err, err_len);
    case KVP_OPT_UINT:
    case KVP_OPT_INT: {
        bool is_signed = o->type == KVP_OPT_INT;
        int64_t max = o->max > 0 ? o->max : INT64_MAX;
        if (!parse_int(value, is_signed, check ? o->min : INT64_MIN, check ? max : INT64_MAX, &v)) {
            char what[96];
            snprintf(what, sizeof(what), "a whole number %lld..%lld", (long long)o->min,
                     (long long)max);
            return bad_value(o, value, err, err_len, what);
        }
        if (o->type == KVP_OPT_INT)
            *(int *)field = (int)v;
        else
            store_uint(field, o->size, (uint64_t)v);
        return KVP_OK;
    }
    case KVP_OPT_SIZE:
        if (!kvp_parse_size(value, &bytes) || (check && bytes < (uint64_t)o->min) ||
            (check && o->max > 0 && bytes > (uint64_t)o->max))
            return bad_value(o, value, err, err_len, "a size such as 64MiB");
        *(uint64_t *)field = bytes;
        return KVP_OK;
    case KVP_OPT_STRING:
    case KVP_OPT_HOSTPORT:
    case KVP_OPT_ENUM:
        return set_string(o, field, value, err, err_len);
    case KVP_OPT_CUSTOM:
        return o->parse(o, value, field, err, err_len);
    }
    return KVP_ERR_INVALID_ARG;
}

kvp_status_t kvp_opt_set(const kvp_opt_t *opt, void *base, const char *value, char *err,
                         size_t err_len)
{
    return opt_set(opt, base, value, true, err, err_len);
}

const kvp_opt_t *kvp_opts_find(const kvp_opts_t *opts, const char *name)
{
    for (size_t i = 0; i < opts->count; i++)
        if (opts->rows[i].name != NULL && strcmp(opts->rows[i].name, name) == 0)
            return &opts->rows[i];
    return NULL;
}

kvp_status_t kvp_opts_defaults(const kvp_opts_t *opts, char *err, size_t err_len)
{
    for (size_t i = 0; i < opts->count; i++) {
        const kvp_opt_t *o = &opts->rows[i];
        if (o->def == NULL)
            continue;
        kvp_status_t st = opt_set(o, opts->base, o->def, false, err, err_len);
        if (st != KVP_OK)
            return st;
    }
    return KVP_OK;
}

kvp_status_t kvp_opts_env(const kvp_opts_t *opts, char *err, size_t err_len)
{
    for (size_t i = 0; i < opts->count; i++) {
        const kvp_opt_t *o = &opts->rows[i];
        /* the daemons' own environment variables are read here, once, before their flags */
        if (o->env == NULL || (o->flags & KVP_OPT_F_READ_ELSEWHERE))
            continue;
        const char *v = getenv(o->env);
        if (v == NULL || v[0] == '\0')
            continue;
        char why[256];
        if (opt_set(o, opts->base, v, true, why, sizeof(why)) == KVP_OK ||
            (o->flags & KVP_OPT_F_ENV_LAX))
            continue;
        snprintf(err, err_len, "$%s: %s", o->env, why);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

/* Does the row take an argument? */
static bool takes_arg(const kvp_opt_t *o)
{
    if (o->type == KVP_OPT_ACTION)
        return o->arg != NULL;
    return o->type != KVP_OPT_SET_TRUE && o->type != KVP_OPT_SET_FALSE && o->type != KVP_OPT_GROUP;
}

size_t kvp_opts_getopt(const kvp_opts_t *sets, size_t nsets, const struct option *extra,
                       struct option *out, size_t cap, const char *short_prefix, char *shortopts,
                       size_t short_len)
{
    size_t n = 0, sl = strlen(short_prefix);
    if (sl >= short_len)
        return 0;
    memcpy(shortopts, short_prefix, sl + 1);
    for (size_t s = 0; s < nsets; s++) {
        for (size_t i = 0; i < sets[s].count; i++) {
            const kvp_opt_t *o = &sets[s].rows[i];
            if (o->type == KVP_OPT_GROUP)
                continue;
            if (n + 1 >= cap)
                return 0;
            out[n++] = (struct option){o->name, takes_arg(o) ? required_argument : no_argument,
                                       NULL, o->short_flag ? o->short_flag : KVP_OPT_VAL(s, i)};
            if (o->short_flag == 0)
                continue;
            if (sl + 3 > short_len)
                return 0;
            shortopts[sl++] = (char)o->short_flag;
            if (takes_arg(o))
                shortopts[sl++] = ':';
            shortopts[sl] = '\0';
        }
    }
    for (; extra != NULL && extra->name != NULL; extra++) {
        if (n + 1 >= cap)
            return 0;
        out[n++] = *extra;
    }
    out[n] = (struct option){NULL, 0, NULL, 0};
    return n;
}

const kvp_opt_t *kvp_opts_lookup(const kvp_opts_t *sets, size_t nsets, int val, size_t *set_p)
{
    for (size_t s = 0; s < nsets; s++) {
        for (size_t i = 0; i < sets[s].count; i++) {
            const kvp_opt_t *o = &sets[s].rows[i];
            if (o->type == KVP_OPT_GROUP)
                continue;
            if (val == (o->short_flag ? o->short_flag : KVP_OPT_VAL(s, i))) {
                *set_p = s;
                return o;
            }
        }
    }
    return NULL;
}

/* ---- words: --help and the docs ---- */

/* The choices of an ENUM row joined by '|' into buf[0..len). */
static const char *choices_text(const kvp_opt_t *o, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; o->choices[i] != NULL; i++)
        n += (size_t)snprintf(buf + KVP_MIN(n, len - 1), len - KVP_MIN(n, len - 1), "%s%s",
                              i ? "|" : "", o->choices[i]);
    return buf;
}

const char *kvp_opt_type_name(const kvp_opt_t *o)
{
    switch (o->type) {
    case KVP_OPT_SET_TRUE:
    case KVP_OPT_SET_FALSE:
        return "switch";
    case KVP_OPT_ACTION:
        return "";
    case KVP_OPT_ON_OFF:
        return "on|off";
    case KVP_OPT_FRACTION:
        return "fraction 0..1";
    case KVP_OPT_SECONDS_MS:
    case KVP_OPT_SECONDS:
    case KVP_OPT_SECONDS_F:
        return "seconds";
    case KVP_OPT_UINT:
    case KVP_OPT_INT:
        return "integer";
    case KVP_OPT_SIZE:
        return "size";
    case KVP_OPT_HOSTPORT:
        return "HOST:PORT";
    case KVP_OPT_ENUM:
        return "enum";
    case KVP_OPT_STRING:
    case KVP_OPT_CUSTOM:
    case KVP_OPT_GROUP:
        break;
    }
    return "string";
}

/* The argument's name in --help: the row's, else the type's. */
static const char *arg_name(const kvp_opt_t *o, char *buf, size_t len)
{
    if (!takes_arg(o))
        return "";
    if (o->arg != NULL)
        return o->arg;
    switch (o->type) {
    case KVP_OPT_ON_OFF:
        return "on|off";
    case KVP_OPT_FRACTION:
        return "F";
    case KVP_OPT_SECONDS_MS:
    case KVP_OPT_SECONDS:
    case KVP_OPT_SECONDS_F:
        return "SECONDS";
    case KVP_OPT_UINT:
    case KVP_OPT_INT:
        return "N";
    case KVP_OPT_SIZE:
        return "SIZE";
    case KVP_OPT_HOSTPORT:
        return "HOST:PORT";
    case KVP_OPT_ENUM:
        return choices_text(o, buf, len);
    default:
        return "VALUE";
    }
}

static const char *default_text(const kvp_opt_t *o);

/* text, then `end` and a newline, on f from column `col` (the cursor is at column `at`),
 * wrapped at WIDTH. */
static void wrap_to(FILE *f, const char *text, size_t at, size_t col, const char *end)
{
    bool first = true; /* the first word follows the cursor, without a blank */
    for (const char *p = text; *p != '\0';) {
        while (*p == ' ')
            p++;
        size_t w = strcspn(p, " ");
        if (w == 0)
            break;
        if (at < col) {
            fprintf(f, "%*s", (int)(col - at), "");
            at = col;
        } else if (at > col && at + 1 + w > WIDTH) {
            fprintf(f, "\n%*s", (int)col, "");
            at = col;
        } else if (!first && at > col) {
            fputc(' ', f);
            at++;
        }
        first = false;
        fwrite(p, 1, w, f);
        at += w;
        p += w;
    }
    fprintf(f, "%s\n", end);
}

void kvp_opts_usage(const kvp_opts_t *opts, size_t col, FILE *f)
{
    for (size_t i = 0; i < opts->count; i++) {
        const kvp_opt_t *o = &opts->rows[i];
        if (o->flags & KVP_OPT_F_HIDDEN)
            continue;
        if (o->type == KVP_OPT_GROUP) {
            fputs(o->help, f);
            if (o->intro != NULL) {
                fputs(" (", f);
                wrap_to(f, o->intro, strlen(o->help) + 2, 0, "):");
            } else {
                fputs(":\n", f);
            }
            continue;
        }
        char buf[256], head[512];
        const char *a = arg_name(o, buf, sizeof(buf));
        int n = o->short_flag
                    ? snprintf(head, sizeof(head), "  -%c, --%s%s%s", o->short_flag, o->name,
                               a[0] ? " " : "", a)
                    : snprintf(head, sizeof(head), "  --%s%s%s", o->name, a[0] ? " " : "", a);
        fputs(head, f);
        size_t at = n < 0 ? 0 : (size_t)n;
        if (at + 2 > col) { /* the help on the next line */
            fputc('\n', f);
            at = 0;
        }
        /* the help, then the default and the environment variable */
        char help[1024];
        const char *d = default_text(o);
        bool show_def = d != NULL && o->type != KVP_OPT_SET_TRUE && o->type != KVP_OPT_SET_FALSE;
        snprintf(help, sizeof(help), "%s%s%s%s%s%s%s", o->help != NULL ? o->help : "",
                 show_def ? " (default " : "", show_def ? d : "", show_def ? ")" : "",
                 o->env != NULL ? " (also $" : "", o->env != NULL ? o->env : "",
                 o->env != NULL ? ")" : "");
        wrap_to(f, help, at, col, "");
    }
}

/* s on f with '|' escaped (a Markdown table cell). */
static void md_cell(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '|')
            fputc('\\', f);
        fputc(*s, f);
    }
}

/* The default as the docs say it. */
static const char *default_text(const kvp_opt_t *o)
{
    if (o->def_doc != NULL)
        return o->def_doc;
    if (o->def != NULL && o->def[0] != '\0')
        return o->def;
    return NULL;
}

/* A GROUP row: its heading and intro; the table that follows needs its header again. */
static void md_group(FILE *f, const kvp_opt_t *o, bool *open_p)
{
    fprintf(f, "%s### %s\n\n", *open_p ? "\n" : "", o->help);
    if (o->intro != NULL) { /* a sentence: capitalised, unless it starts with a path */
        size_t w = strcspn(o->intro, " ");
        bool path = memchr(o->intro, '/', w) != NULL;
        fprintf(f, "%c%s.\n\n", path ? o->intro[0] : toupper((unsigned char)o->intro[0]),
                o->intro + 1);
    }
    *open_p = false;
}

/* The type column: an ENUM's choices, a row's own argument name for CUSTOM, else the
 * type's name. */
static void md_type(FILE *f, const kvp_opt_t *o)
{
    char buf[256];
    if (o->type == KVP_OPT_ENUM)
        md_cell(f, choices_text(o, buf, sizeof(buf)));
    else if (o->type == KVP_OPT_CUSTOM && o->arg != NULL)
        md_cell(f, o->arg);
    else
        md_cell(f, kvp_opt_type_name(o));
}

/* The cells of a row from its default on: default, (more,) description. */
static void md_default_help(FILE *f, const kvp_opt_t *o, const char *more)
{
    const char *d = default_text(o);
    md_cell(f, d != NULL ? d : "");
    fprintf(f, " | %s", more);
    md_cell(f, o->help != NULL ? o->help : "");
    fputs(" |\n", f);
}

static void md_env_row(FILE *f, const kvp_opt_t *o)
{
    fprintf(f, "| `%s` | ", o->env);
    if (o->type == KVP_OPT_STRING && o->arg != NULL)
        md_cell(f, o->arg);
    else
        md_type(f, o);
    fputs(" | ", f);
    md_default_help(f, o, "");
}

static void md_flag_row(FILE *f, const kvp_opt_t *o)
{
    char buf[256], more[256];
    const char *a = arg_name(o, buf, sizeof(buf));
    fputs("| ", f);
    if (o->short_flag)
        fprintf(f, "`-%c`, ", o->short_flag);
    fprintf(f, "`--%s%s", o->name, a[0] ? " " : "");
    md_cell(f, a);
    fputs("` | ", f);
    md_type(f, o);
    fputs(" | ", f);
    bool key = o->type != KVP_OPT_ACTION; /* --help in a file is no setting */
    snprintf(more, sizeof(more), "%s%s%s | %s%s%s | ", key ? "`" : "", key ? o->name : "",
             key ? "`" : "", o->env ? "`" : "", o->env ? o->env : "", o->env ? "`" : "");
    md_default_help(f, o, more);
}

/* The rows as tables, a heading per group; `header` opens each table; env_only: the rows
 * with an environment variable only. */
static void md_tables(const kvp_opts_t *opts, FILE *f, const char *header, bool env_only,
                      void (*row)(FILE *f, const kvp_opt_t *o))
{
    bool open = false;
    for (size_t i = 0; i < opts->count; i++) {
        const kvp_opt_t *o = &opts->rows[i];
        if (o->flags & KVP_OPT_F_HIDDEN)
            continue;
        if (o->type == KVP_OPT_GROUP) {
            md_group(f, o, &open);
            continue;
        }
        if (env_only && o->env == NULL)
            continue;
        if (!open)
            fputs(header, f);
        open = true;
        row(f, o);
    }
}

void kvp_opts_env_markdown(const kvp_opts_t *opts, FILE *f)
{
    md_tables(opts, f, "| Variable | Value | Default | Description |\n|---|---|---|---|\n", true,
              md_env_row);
}

void kvp_opts_markdown(const kvp_opts_t *opts, FILE *f)
{
    md_tables(opts, f,
              "| Flag | Type | Default | Config key | Environment | Description |\n"
              "|---|---|---|---|---|---|\n",
              false, md_flag_row);
}

kvp_status_t kvp_opt_parse_log_level(const kvp_opt_t *opt, const char *value, void *field,
                                     char *err, size_t err_len)
{
    (void)opt;
    kvp_log_level_t lvl;
    if (!kvp_log_parse_level(value, &lvl)) {
        snprintf(err, err_len, "unknown log level '%s'", value);
        return KVP_ERR_INVALID_ARG;
    }
    *(int *)field = (int)lvl;
    return KVP_OK;
}
