/*
 * test_options.c - unit tests for common/options.c: each type's reading (good and bad
 * values, the field it writes by size), the defaults, the environment, the getopt table
 * made from the rows, and the usage and Markdown texts.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macros.h"
#include "common/options.h"
#include "common/status.h"

typedef struct conf {
    bool on;
    uint32_t counted; /* a switch into an integer field */
    bool enabled;
    double frac;
    uint32_t ms;
    uint32_t secs;
    double secs_f;
    uint16_t port;
    int fd;
    uint64_t bytes;
    char name[8];
    const char *path;
    const char *hp;
    const char *mode;
    int custom;
} conf_t;

#define F(field) KVP_OPT_FIELD(conf_t, field)
static const char *const modes[] = {"fast", "safe", NULL};

/* CUSTOM: "x" is 42, anything else an error. */
static kvp_status_t parse_x(const kvp_opt_t *opt, const char *value, void *field, char *err,
                            size_t err_len)
{
    (void)opt;
    if (strcmp(value, "x") != 0) {
        snprintf(err, err_len, "not x: %s", value);
        return KVP_ERR_INVALID_ARG;
    }
    *(int *)field = 42;
    return KVP_OK;
}

static const kvp_opt_t rows[] = {
    KVP_OPT_GROUP("First", "a group's intro"),
    {.name = "on", .type = KVP_OPT_SET_TRUE, .def = "off", F(on), .help = "turn it on"},
    {.name = "counted", .type = KVP_OPT_SET_TRUE, F(counted), .help = "an integer switch"},
    {.name = "no-enabled", .type = KVP_OPT_SET_FALSE, .def = "on", F(enabled), .help = "off"},
    {.name = "frac", .type = KVP_OPT_FRACTION, .def = "0.5", F(frac), .help = "a fraction"},
    {.name = "ms", .type = KVP_OPT_SECONDS_MS, .def = "1.5", F(ms), .help = "ms"},
    {.name = "secs", .type = KVP_OPT_SECONDS, .def = "7.9", F(secs), .help = "s"},
    {.name = "secs-f",
     .type = KVP_OPT_SECONDS_F,
     .def = "2",
     F(secs_f),
     .max = 100,
     .need = "seconds (0..100)",
     .help = "double seconds"},
    {.name = "port",
     .short_flag = 'p',
     .type = KVP_OPT_UINT,
     .arg = "PORT",
     .def = "80",
     F(port),
     .max = 65535,
     .env = "KVP_TEST_OPT_PORT",
     .help = "a port"},
    {.name = "fd",
     .type = KVP_OPT_INT,
     .def = "-1",
     .def_doc = "none",
     F(fd),
     .min = 0,
     .max = 1000,
     .need = "a file descriptor",
     .help = "an fd"},
    {.name = "bytes",
     .type = KVP_OPT_SIZE,
     .def = "4KiB",
     F(bytes),
     .min = 1024,
     .max = 1 << 30,
     .help = "a size"},
    KVP_OPT_GROUP("Second", NULL),
    {.name = "name",
     .type = KVP_OPT_STRING,
     .def = "abc",
     F(name),
     .help = "a name in a char array, with a|pipe"},
    {.name = "path",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     .arg = "FILE",
     F(path),
     .env = "KVP_TEST_OPT_PATH",
     .help = "a borrowed path"},
    {.name = "hp", .type = KVP_OPT_HOSTPORT, .flags = KVP_OPT_F_PTR, F(hp), .help = "an address"},
    {.name = "mode",
     .type = KVP_OPT_ENUM,
     .flags = KVP_OPT_F_PTR,
     .choices = modes,
     .def = "safe",
     F(mode),
     .help = "a mode"},
    {.name = "custom",
     .type = KVP_OPT_CUSTOM,
     .arg = "X",
     .parse = parse_x,
     F(custom),
     .env = "KVP_TEST_OPT_CUSTOM",
     .flags = KVP_OPT_F_ENV_LAX,
     .help = "custom"},
    {.name = "help", .short_flag = 'h', .type = KVP_OPT_ACTION, .help = "this text"},
    {.name = "secret", .type = KVP_OPT_ACTION, .flags = KVP_OPT_F_HIDDEN, .help = "hidden"},
    {.name = "elsewhere",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_READ_ELSEWHERE,
     .env = "KVP_TEST_OPT_ELSEWHERE",
     F(name),
     .help = "read by someone else"},
};

static kvp_opts_t table(conf_t *c)
{
    return (kvp_opts_t){.rows = rows, .count = KVP_ARRAY_SIZE(rows), .base = c};
}

static kvp_status_t set(conf_t *c, const char *name, const char *value, char *err, size_t len)
{
    kvp_opts_t t = table(c);
    const kvp_opt_t *o = kvp_opts_find(&t, name);
    assert_non_null(o);
    return kvp_opt_set(o, c, value, err, len);
}

static void test_defaults(void **state)
{
    (void)state;
    conf_t c;
    memset(&c, 0x5a, sizeof(c));
    c.path = c.hp = NULL;
    kvp_opts_t t = table(&c);
    char err[128];
    assert_int_equal(kvp_opts_defaults(&t, err, sizeof(err)), KVP_OK);
    assert_false(c.on);
    assert_true(c.enabled);
    assert_true(c.frac == 0.5);
    assert_int_equal(c.ms, 1500);
    assert_int_equal(c.secs, 7);
    assert_true(c.secs_f == 2.0);
    assert_int_equal(c.port, 80);
    assert_int_equal(c.fd, -1); /* a sentinel: defaults are not range-checked */
    assert_int_equal(c.bytes, 4096);
    assert_string_equal(c.name, "abc");
    assert_string_equal(c.mode, "safe");
    assert_null(c.path);
}

static void test_values_ok(void **state)
{
    (void)state;
    conf_t c = {0};
    char err[128];
    assert_int_equal(set(&c, "on", NULL, err, sizeof(err)), KVP_OK);
    assert_true(c.on);
    c.counted = 0;
    assert_int_equal(set(&c, "counted", NULL, err, sizeof(err)), KVP_OK);
    assert_int_equal(c.counted, 1);
    c.enabled = true;
    assert_int_equal(set(&c, "no-enabled", NULL, err, sizeof(err)), KVP_OK);
    assert_false(c.enabled);
    assert_int_equal(set(&c, "frac", "1", err, sizeof(err)), KVP_OK);
    assert_true(c.frac == 1.0);
    assert_int_equal(set(&c, "ms", "0.25", err, sizeof(err)), KVP_OK);
    assert_int_equal(c.ms, 250);
    assert_int_equal(set(&c, "secs-f", "99.5", err, sizeof(err)), KVP_OK);
    assert_true(c.secs_f == 99.5);
    assert_int_equal(set(&c, "port", "65535", err, sizeof(err)), KVP_OK);
    assert_int_equal(c.port, 65535);
    assert_int_equal(set(&c, "fd", "3", err, sizeof(err)), KVP_OK);
    assert_int_equal(c.fd, 3);
    assert_int_equal(set(&c, "bytes", "64MiB", err, sizeof(err)), KVP_OK);
    assert_int_equal(c.bytes, 64u << 20);
    assert_int_equal(set(&c, "name", "1234567", err, sizeof(err)), KVP_OK);
    assert_string_equal(c.name, "1234567");
    const char *path = "";
    assert_int_equal(set(&c, "path", path, err, sizeof(err)), KVP_OK); /* "" allowed */
    assert_ptr_equal(c.path, path);                                    /* borrowed */
    assert_int_equal(set(&c, "hp", "[::1]:0", err, sizeof(err)), KVP_OK);
    assert_int_equal(set(&c, "mode", "fast", err, sizeof(err)), KVP_OK);
    assert_string_equal(c.mode, "fast");
    assert_int_equal(set(&c, "custom", "x", err, sizeof(err)), KVP_OK);
    assert_int_equal(c.custom, 42);
}

static void test_values_bad(void **state)
{
    (void)state;
    static const struct {
        const char *name, *value, *msg;
    } cases[] = {
        {"frac", "1.5", "bad value '1.5' for a watermark (0..1)"},
        {"frac", "", "bad value '' for a watermark (0..1)"},
        {"ms", "soon", "bad value 'soon' for a time in seconds"},
        {"ms", "-1", "bad value '-1' for a time in seconds"},
        {"secs", "1e12", "bad value '1e12' for a time in seconds"},
        {"secs-f", "101", "--secs-f needs seconds (0..100), got '101'"},
        {"port", "65536", "--port needs a whole number 0..65535, got '65536'"},
        {"port", "-1", "--port needs a whole number 0..65535, got '-1'"},
        {"port", "8x", "--port needs a whole number 0..65535, got '8x'"},
        {"fd", "-1", "--fd needs a file descriptor, got '-1'"},
        {"bytes", "1000", "--bytes needs a size such as 64MiB, got '1000'"},
        {"bytes", "lots", "--bytes needs a size such as 64MiB, got 'lots'"},
        {"bytes", "2GiB", "--bytes needs a size such as 64MiB, got '2GiB'"}, /* past max */
        {"name", "12345678", "--name needs a value of 1..7 bytes"},
        {"name", "", "--name needs a value of 1..7 bytes"},
        {"hp", "nope", "--hp needs HOST:PORT, got 'nope'"},
        {"mode", "slow", "--mode needs one of fast|safe, got 'slow'"},
        {"custom", "y", "not x: y"},
    };
    for (size_t i = 0; i < KVP_ARRAY_SIZE(cases); i++) {
        conf_t c = {0};
        char err[128] = "";
        if (set(&c, cases[i].name, cases[i].value, err, sizeof(err)) != KVP_ERR_INVALID_ARG)
            fail_msg("--%s %s accepted", cases[i].name, cases[i].value);
        if (strcmp(err, cases[i].msg) != 0)
            fail_msg("--%s %s: '%s', want '%s'", cases[i].name, cases[i].value, err, cases[i].msg);
    }
}

static void test_env(void **state)
{
    (void)state;
    conf_t c = {0};
    kvp_opts_t t = table(&c);
    char err[128];
    setenv("KVP_TEST_OPT_PORT", "8080", 1);
    setenv("KVP_TEST_OPT_PATH", "", 1);         /* empty: unset */
    setenv("KVP_TEST_OPT_CUSTOM", "bad", 1);    /* lax: ignored */
    setenv("KVP_TEST_OPT_ELSEWHERE", "zzz", 1); /* read elsewhere: skipped */
    assert_int_equal(kvp_opts_env(&t, err, sizeof(err)), KVP_OK);
    assert_int_equal(c.port, 8080);
    assert_null(c.path);
    assert_int_equal(c.custom, 0);
    assert_string_equal(c.name, "");
    setenv("KVP_TEST_OPT_PORT", "99999", 1);
    assert_int_equal(kvp_opts_env(&t, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    assert_string_equal(err, "$KVP_TEST_OPT_PORT: --port needs a whole number 0..65535, got "
                             "'99999'");
    unsetenv("KVP_TEST_OPT_PORT");
    unsetenv("KVP_TEST_OPT_PATH");
    unsetenv("KVP_TEST_OPT_CUSTOM");
    unsetenv("KVP_TEST_OPT_ELSEWHERE");
}

static void test_getopt(void **state)
{
    (void)state;
    conf_t c = {0};
    kvp_opts_t t = table(&c);
    static const struct option extra[] = {{"extra", no_argument, NULL, 0x300}, {NULL, 0, NULL, 0}};
    struct option lo[32];
    char so[16];
    size_t n = kvp_opts_getopt(&t, 1, extra, lo, KVP_ARRAY_SIZE(lo), "+:", so, sizeof(so));
    assert_int_equal(n, KVP_ARRAY_SIZE(rows) - 2 + 1); /* no groups, one extra */
    assert_string_equal(so, "+:p:h");
    assert_null(lo[n].name);
    assert_int_equal(kvp_opts_getopt(&t, 1, extra, lo, 4, "", so, sizeof(so)), 0);

    char *argv[] = {"prog", "-p", "81", "--name=xyz", "--on", "--extra", "--help", NULL};
    int argc = 7, opt, seen = 0;
    optind = 0;
    while ((opt = getopt_long(argc, argv, "+:p:h", lo, NULL)) != -1) {
        size_t set_i = 99;
        const kvp_opt_t *o = kvp_opts_lookup(&t, 1, opt, &set_i);
        if (opt == 0x300) {
            assert_null(o);
            seen++;
            continue;
        }
        assert_non_null(o);
        assert_int_equal(set_i, 0);
        if (o->type == KVP_OPT_ACTION) {
            assert_string_equal(o->name, "help");
            seen++;
            continue;
        }
        char err[64];
        assert_int_equal(kvp_opt_set(o, &c, optarg, err, sizeof(err)), KVP_OK);
    }
    assert_int_equal(seen, 2);
    assert_int_equal(c.port, 81);
    assert_string_equal(c.name, "xyz");
    assert_true(c.on);
}

/* f's text, from open_memstream. */
static char *capture(void (*fn)(const kvp_opts_t *, FILE *), const kvp_opts_t *t, size_t col)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    if (fn != NULL)
        fn(t, f);
    else
        kvp_opts_usage(t, col, f);
    fclose(f);
    return buf;
}

static void test_usage(void **state)
{
    (void)state;
    kvp_opts_t t = table(NULL);
    char *u = capture(NULL, &t, 20);
    assert_non_null(strstr(u, "First (a group's intro):\n"));
    assert_non_null(
        strstr(u, "  -p, --port PORT   a port (default 80) (also $KVP_TEST_OPT_PORT)\n"));
    assert_non_null(strstr(u, "  --fd N            an fd (default none)\n"));
    assert_non_null(strstr(u, "  --mode fast|safe  a mode (default safe)\n"));
    assert_non_null(strstr(u, "  --on              turn it on\n")); /* switches: no default */
    assert_null(strstr(u, "secret"));
    for (char *line = u; *line != '\0'; line = strchr(line, '\n') + 1)
        assert_true(strcspn(line, "\n") <= 79);
    free(u);
}

static void test_markdown(void **state)
{
    (void)state;
    kvp_opts_t t = table(NULL);
    char *m = capture(kvp_opts_markdown, &t, 0);
    assert_non_null(strstr(m, "### First\n\nA group's intro.\n\n| Flag | Type | Default |"));
    assert_non_null(strstr(m, "| `-p`, `--port PORT` | integer | 80 | `port` | "
                              "`KVP_TEST_OPT_PORT` | a port |\n"));
    assert_non_null(strstr(m, "| `--mode fast\\|safe` | fast\\|safe | safe | `mode` |  | a "
                              "mode |\n"));
    assert_non_null(strstr(m, "a name in a char array, with a\\|pipe |"));
    assert_non_null(strstr(m, "\n\n### Second\n\n| Flag |"));
    assert_null(strstr(m, "secret"));
    free(m);
    m = capture(kvp_opts_env_markdown, &t, 0);
    assert_non_null(strstr(m, "| `KVP_TEST_OPT_PORT` | integer | 80 | a port |\n"));
    assert_non_null(strstr(m, "| `KVP_TEST_OPT_PATH` | FILE |  | a borrowed path |\n"));
    assert_null(strstr(m, "--mode"));
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),   cmocka_unit_test(test_values_ok),
        cmocka_unit_test(test_values_bad), cmocka_unit_test(test_env),
        cmocka_unit_test(test_getopt),     cmocka_unit_test(test_usage),
        cmocka_unit_test(test_markdown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
