/*
 * conf.c - config files for the daemons: an INI file read as the flags it
 * stands for (see conf.h).
 *
 * Design: a file is not a second way to set things, only a list of flags.
 * Each key that applies becomes "--KEY=VALUE" (or "--KEY"), placed after
 * argv[0] and before the command line's own arguments, and the program's one
 * getopt loop reads everything, so a flag and its key can never mean two
 * things, and a flag given on the command line comes later and wins.
 *
 * libinih does the INI syntax; we hand it the lines through our own reader
 * (ini_parse_stream) rather than ini_parse_file because inih, as Debian builds
 * it, would otherwise
 *   - cut a line longer than its buffer (200 bytes) and read the rest as the
 *     next line, a silent misreading and wrong line numbers from there on; the
 *     reader reads whole lines with getline and refuses a long one;
 *   - take an indented line for the continuation of the previous key's value
 *     (multiline values, on in that build); the reader drops leading blanks,
 *     so an indented key is a key (values are one line);
 *   - go on after the first error; the reader ends the input once one is
 *     recorded, so the first error is the one reported.
 * The reader also counts lines, which gives the handler (called for the line
 * the reader returned last) its line number.
 *
 * The flags produced live in one allocation with the new argv's pointer
 * array in front of them, so freeing the array frees them all, however getopt
 * permuted the pointers. The strings of the original argv are borrowed.
 *
 * Thread: any; no state besides the call's own (inih's settings are read,
 * never written).
 */
#include "common/conf.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>

#include <ini.h>

/* The flags a file stands for, in file order: "--KEY[=VALUE]\0" one after the other. */
typedef struct conf_flags {
    char *buf;
    size_t len, cap;
    int count;
} conf_flags_t;

/* One file being read: the reader's and the handler's shared state. */
typedef struct conf_reader {
    const char *path;
    FILE *f;
    const struct option *opts;
    const char *section;
    char *line; /* getline's buffer */
    size_t line_cap;
    int lineno; /* of the line returned last */
    kvp_status_t status;
    bool failed;
    conf_flags_t flags;
    char *err;
    size_t err_len;
} conf_reader_t;

/* Record the first error of the file ("PATH:LINE: ..."); later ones are consequences. */
static void conf_fail(conf_reader_t *r, kvp_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void conf_fail(conf_reader_t *r, kvp_status_t status, const char *fmt, ...)
{
    if (r->failed)
        return;
    r->failed = true;
    r->status = status;
    if (r->err == NULL || r->err_len == 0)
        return;
    int n = snprintf(r->err, r->err_len, "%s:%d: ", r->path, r->lineno);
    if (n < 0 || (size_t)n >= r->err_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + n, r->err_len - (size_t)n, fmt, ap);
    va_end(ap);
}

static bool conf_flags_add(conf_flags_t *fl, const char *name, const char *value)
{
    size_t need = 2 + strlen(name) + (value != NULL ? 1 + strlen(value) : 0) + 1;
    if (fl->cap - fl->len < need) {
        size_t cap = fl->cap != 0 ? fl->cap : 256;
        while (cap - fl->len < need)
            cap *= 2;
        char *buf = realloc(fl->buf, cap);
        if (buf == NULL)
            return false;
        fl->buf = buf;
        fl->cap = cap;
    }
    int n = snprintf(fl->buf + fl->len, need, "--%s%s%s", name, value != NULL ? "=" : "",
                     value != NULL ? value : "");
    fl->len += (size_t)n + 1;
    fl->count++;
    return true;
}

/*
 * inih's reader: the next whole line without its leading blanks and line end.
 * NULL at the end of the file and once an error is recorded, which ends the parse.
 */
static char *conf_read_line(char *str, int num, void *stream)
{
    conf_reader_t *r = stream;
    if (r->failed)
        return NULL;
    errno = 0;
    ssize_t n = getline(&r->line, &r->line_cap, r->f);
    if (n < 0) {
        if (ferror(r->f)) {
            int e = errno;
            r->lineno++;
            conf_fail(r, KVP_ERR_INVALID_ARG, "cannot read: %s", strerror(e));
        } else if (errno == ENOMEM) {
            conf_fail(r, KVP_ERR_NOMEM, "out of memory");
        }
        return NULL;
    }
    r->lineno++;
    size_t len = (size_t)n;
    if (memchr(r->line, '\0', len) != NULL) {
        conf_fail(r, KVP_ERR_INVALID_ARG, "a NUL byte: not a text file");
        return NULL;
    }
    while (len > 0 && (r->line[len - 1] == '\n' || r->line[len - 1] == '\r'))
        len--;
    const char *s = r->line;
    while (len > 0 && isspace((unsigned char)*s))
        s++, len--;
    /* num counts the NUL; the line end is gone, so a line of num - 1 bytes (blanks before
     * the key not counted) fits whole */
    if (num < 1 || len > (size_t)num - 1) {
        conf_fail(r, KVP_ERR_INVALID_ARG, "line too long (%zu bytes; at most %d)", len,
                  num > 0 ? num - 1 : 0);
        return NULL;
    }
    memcpy(str, s, len);
    str[len] = '\0';
    return str;
}

/* Keys before any section apply, and those of [section] (blanks inside the brackets ignored). */
static bool conf_section_applies(const char *name, const char *section)
{
    while (isspace((unsigned char)*name))
        name++;
    size_t len = strlen(name);
    while (len > 0 && isspace((unsigned char)name[len - 1]))
        len--;
    return len == 0 || (strlen(section) == len && strncmp(name, section, len) == 0);
}

static bool conf_parse_bool(const char *value, bool *on_p)
{
    static const char *const on[] = {"true", "yes", "on", "1"};
    static const char *const off[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
        if (strcasecmp(value, on[i]) == 0) {
            *on_p = true;
            return true;
        }
        if (strcasecmp(value, off[i]) == 0) {
            *on_p = false;
            return true;
        }
    }
    return false;
}

/* inih's handler: one key = value of the file. 0 (an error) stops the parse through the reader. */
static int conf_on_key(void *user, const char *section, const char *name, const char *value)
{
    conf_reader_t *r = user;
    if (name == NULL || !conf_section_applies(section, r->section))
        return 1;
    if (value == NULL) /* only if someone turned on inih's ini_allow_no_value */
        value = "";
    if (strcmp(name, "config") == 0) {
        conf_fail(r, KVP_ERR_INVALID_ARG,
                  "'config' cannot be set in a config file (one file, no nesting)");
        return 0;
    }
    const struct option *o = r->opts;
    while (o->name != NULL && strcmp(o->name, name) != 0)
        o++;
    if (o->name == NULL) {
        conf_fail(r, KVP_ERR_INVALID_ARG, "unknown key '%s' (not a flag of this program)", name);
        return 0;
    }
    bool ok = true;
    if (o->has_arg == no_argument) {
        bool on;
        if (!conf_parse_bool(value, &on)) {
            conf_fail(r, KVP_ERR_INVALID_ARG,
                      "'%s' is a switch: true or false (yes/no, on/off, 1/0), not '%s'", name,
                      value);
            return 0;
        }
        if (on)
            ok = conf_flags_add(&r->flags, name, NULL);
    } else if (o->has_arg == required_argument) {
        if (value[0] == '\0') {
            conf_fail(r, KVP_ERR_INVALID_ARG, "'%s' needs a value (%s = VALUE)", name, name);
            return 0;
        }
        ok = conf_flags_add(&r->flags, name, value);
    } else {
        ok = conf_flags_add(&r->flags, name, value[0] != '\0' ? value : NULL);
    }
    if (!ok) {
        conf_fail(r, KVP_ERR_NOMEM, "out of memory");
        return 0;
    }
    return 1;
}

/* Read the file at path into r->flags. On failure r->flags may hold a part: the caller frees it. */
static kvp_status_t conf_read_file(conf_reader_t *r)
{
    r->f = fopen(r->path, "re");
    if (r->f == NULL) {
        kvp_errf(r->err, r->err_len, "cannot open config file %s: %s", r->path, strerror(errno));
        return KVP_ERR_INVALID_ARG;
    }
    int rc = ini_parse_stream(conf_read_line, r, conf_on_key, r);
    if (!r->failed && rc != 0) {
        /* inih's own syntax errors: a line without '=' (or ':'), a '[' without ']' */
        r->lineno = rc;
        if (rc > 0)
            conf_fail(r, KVP_ERR_INVALID_ARG,
                      "expected 'key = value', '[section]' or a comment ('#' or ';')");
        else
            conf_fail(r, KVP_ERR_NOMEM, "cannot parse: inih failed (%d)", rc);
    }
    fclose(r->f);
    r->f = NULL;
    free(r->line);
    r->line = NULL;
    return r->failed ? r->status : KVP_OK;
}

/*
 * How getopt_long resolves "--NAME" (name_len bytes, before any '='): an exact
 * match, else the one long option NAME abbreviates; NULL if none or ambiguous.
 * "config" counts as a long option taking an argument whether or not opts has
 * it, since it is taken out before getopt runs.
 */
static const struct option *conf_match(const struct option *opts, const char *name, size_t name_len)
{
    static const struct option config_opt = {"config", required_argument, NULL, 0};
    const struct option *found = NULL;
    bool ambiguous = false;
    for (const struct option *o = opts;; o++) {
        bool end = o->name == NULL;
        if (end)
            o = &config_opt;
        else if (strcmp(o->name, "config") == 0)
            continue;
        if (strncmp(o->name, name, name_len) == 0) {
            if (o->name[name_len] == '\0')
                return o;
            if (found == NULL)
                found = o;
            else if (found->has_arg != o->has_arg || found->flag != o->flag || found->val != o->val)
                ambiguous = true;
        }
        if (end)
            break;
    }
    return ambiguous ? NULL : found;
}

/*
 * Find --config in argv as getopt_long would read argv: among the options
 * before a bare "--", not as the value of an option that takes the next
 * argument. *at_p: its index (-1 if none), *nargs_p: 1 ("--config=FILE") or 2.
 * Short options are taken to have no argument (the daemons' only one is -h).
 */
static kvp_status_t conf_find(int argc, char **argv, const struct option *opts, int *at_p,
                              int *nargs_p, const char **path_p, char *err, size_t err_len)
{
    int at = -1, nargs = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            break;
        if (strncmp(a, "--", 2) != 0)
            continue; /* an operand, "-" or short options */
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq != NULL ? (size_t)(eq - name) : strlen(name);
        const struct option *o = conf_match(opts, name, name_len);
        if (o == NULL)
            continue; /* getopt_long will refuse it */
        if (strcmp(o->name, "config") != 0) {
            if (o->has_arg == required_argument && eq == NULL)
                i++; /* its value, whatever it looks like */
            continue;
        }
        const char *file = eq != NULL ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
        if (file == NULL || file[0] == '\0') {
            kvp_errf(err, err_len, "--config needs a file name");
            return KVP_ERR_INVALID_ARG;
        }
        if (at >= 0) {
            kvp_errf(err, err_len, "--config given twice ('%s', then '%s'): give one file", path,
                     file);
            return KVP_ERR_INVALID_ARG;
        }
        at = i;
        nargs = eq != NULL ? 1 : 2;
        path = file;
        i += nargs - 1;
    }
    *at_p = at;
    *nargs_p = nargs;
    *path_p = path;
    return KVP_OK;
}

kvp_status_t kvp_conf_expand_argv(int argc, char **argv, const struct option *opts,
                                  const char *section, int *argc_out, char ***argv_out, char *err,
                                  size_t err_len)
{
    int at, nargs;
    const char *path;
    kvp_status_t status = conf_find(argc, argv, opts, &at, &nargs, &path, err, err_len);
    if (status != KVP_OK)
        return status;
    if (at < 0) {
        *argc_out = argc;
        *argv_out = argv;
        return KVP_OK;
    }

    conf_reader_t r = {
        .path = path, .opts = opts, .section = section, .err = err, .err_len = err_len};
    status = conf_read_file(&r);
    if (status != KVP_OK)
        goto err_free_flags;

    /* argv[0], the file's flags, then argv[1..] without the --config pair, then NULL */
    int n = argc - nargs + r.flags.count;
    size_t array_len = (size_t)(n + 1) * sizeof(char *);
    char **out = malloc(array_len + r.flags.len);
    if (out == NULL) {
        kvp_errf(err, err_len, "out of memory");
        status = KVP_ERR_NOMEM;
        goto err_free_flags;
    }
    char *s = (char *)out + array_len;
    if (r.flags.len > 0)
        memcpy(s, r.flags.buf, r.flags.len);
    int k = 0;
    out[k++] = argv[0];
    for (int i = 0; i < r.flags.count; i++) {
        out[k++] = s;
        s += strlen(s) + 1;
    }
    for (int i = 1; i < argc; i++)
        if (i < at || i >= at + nargs)
            out[k++] = argv[i];
    out[k] = NULL;
    free(r.flags.buf);
    *argc_out = n;
    *argv_out = out;
    return KVP_OK;

err_free_flags:
    free(r.flags.buf);
    return status;
}

void kvp_conf_free_argv(char **argv_out, char **argv)
{
    if (argv_out != argv)
        free(argv_out); /* the file's flags are in the same allocation */
}
