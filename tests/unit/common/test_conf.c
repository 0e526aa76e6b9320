/*
 * test_conf.c - common/conf.c: config files turned into flags.
 *
 * Real files: each test writes its config under /tmp (mkstemp) and the
 * teardown removes them. The option table mimics a daemon's: options with a
 * required argument, a switch, an optional argument. Where the order of the
 * result matters (command-line flags overriding the file's), the result is
 * also run through getopt_long, the way the daemons read it.
 */
#include <errno.h>
#include <getopt.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/conf.h"

static const struct option opts[] = {
    {"listen", required_argument, NULL, 'l'},   {"lease-ttl", required_argument, NULL, 't'},
    {"ready-fd", required_argument, NULL, 'r'}, {"name", required_argument, NULL, 'n'},
    {"no-eviction", no_argument, NULL, 'E'},    {"verbose", optional_argument, NULL, 'v'},
    {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
};

/* The files a test wrote, removed by the teardown whatever the outcome. */
#define MAX_FILES 8
static char files[MAX_FILES][64];
static int nfiles;

static int remove_files(void **state)
{
    (void)state;
    for (int i = 0; i < nfiles; i++)
        unlink(files[i]);
    nfiles = 0;
    return 0;
}

/* A new file under /tmp holding text; returns its path (valid until the teardown). */
static const char *write_conf(const char *text)
{
    assert_true(nfiles < MAX_FILES);
    char *path = files[nfiles];
    snprintf(path, sizeof(files[0]), "/tmp/kvp_test_conf_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    nfiles++;
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    assert_int_equal(close(fd), 0);
    return path;
}

/* An argv like main's: NULL-terminated, strings the test owns. */
#define ARGV(...) ((char *[]){__VA_ARGS__, NULL})

static int count(char **argv)
{
    int n = 0;
    while (argv[n] != NULL)
        n++;
    return n;
}

typedef struct expanded {
    kvp_status_t status;
    int argc;
    char **argv;
    char err[512];
} expanded_t;

static void expand(char **in, const char *section, expanded_t *e)
{
    e->argc = -1;
    e->argv = NULL;
    e->err[0] = '\0';
    e->status = kvp_conf_expand_argv(count(in), in, opts, section, &e->argc, &e->argv, e->err,
                                     sizeof(e->err));
}

/* argv_out equals want (NULL-terminated), is NULL-terminated itself, and is freed. */
static void check_and_free(expanded_t *e, char **in, char **want)
{
    assert_int_equal(e->status, KVP_OK);
    int n = count(want);
    assert_int_equal(e->argc, n);
    for (int i = 0; i < n; i++)
        assert_string_equal(e->argv[i], want[i]);
    assert_null(e->argv[e->argc]);
    kvp_conf_free_argv(e->argv, in);
}

/* The call failed with KVP_ERR_INVALID_ARG and the message want, out-parameters untouched. */
static void check_error(expanded_t *e, const char *want)
{
    assert_int_equal(e->status, KVP_ERR_INVALID_ARG);
    assert_int_equal(e->argc, -1);
    assert_null(e->argv);
    assert_string_equal(e->err, want);
}

/* err is "PATH:LINE: " followed by rest. */
static void check_file_error(expanded_t *e, const char *path, int line, const char *rest)
{
    char want[512];
    snprintf(want, sizeof(want), "%s:%d: %s", path, line, rest);
    check_error(e, want);
}

static void test_no_config_returns_argv(void **state)
{
    (void)state;
    char **in = ARGV("prog", "--listen", "a:1", "x");
    expanded_t e;
    expand(in, "master", &e);
    assert_int_equal(e.status, KVP_OK);
    assert_int_equal(e.argc, 4);
    assert_ptr_equal(e.argv, in);
    kvp_conf_free_argv(e.argv, in); /* a no-op */
    assert_string_equal(in[1], "--listen");
}

static void test_keys_in_file_order(void **state)
{
    (void)state;
    const char *path = write_conf("lease-ttl = 7\n"
                                  "listen = 127.0.0.1:5000\n"
                                  "ready-fd = 3\n"
                                  "lease-ttl = 9\n");
    char **in = ARGV("prog", "--config", (char *)path, "extra");
    expanded_t e;
    expand(in, "master", &e);
    check_and_free(&e, in,
                   ARGV("prog", "--lease-ttl=7", "--listen=127.0.0.1:5000", "--ready-fd=3",
                        "--lease-ttl=9", "extra"));
}

static void test_config_equals_form(void **state)
{
    (void)state;
    const char *path = write_conf("listen = h:1\n");
    char arg[128];
    snprintf(arg, sizeof(arg), "--config=%s", path);
    char **in = ARGV("prog", "--name", "n", arg, "--help");
    expanded_t e;
    expand(in, "master", &e);
    check_and_free(&e, in, ARGV("prog", "--listen=h:1", "--name", "n", "--help"));
}

static void test_empty_file(void **state)
{
    (void)state;
    const char *path = write_conf("# nothing set\n\n");
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_and_free(&e, in, ARGV("prog"));
}

/* Read the result as the daemons do; *listen_p and *ttl_p: the last values given. */
static void run_getopt(int argc, char **argv, const char **listen_p, const char **ttl_p,
                       int *no_evict_p)
{
    optind = 0; /* glibc: start over, forgetting the previous scan */
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'l')
            *listen_p = optarg;
        else if (opt == 't')
            *ttl_p = optarg;
        else if (opt == 'E')
            (*no_evict_p)++;
        else
            assert_true(opt != '?');
    }
    assert_int_equal(optind, argc);
}

static void test_command_line_overrides_file(void **state)
{
    (void)state;
    const char *path = write_conf("listen = file:1\n"
                                  "lease-ttl = 5\n");
    /* flags before and after --config on the command line both come after the file's */
    char **in = ARGV("prog", "--listen", "cmd:2", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    assert_int_equal(e.status, KVP_OK);
    const char *listen = NULL, *ttl = NULL;
    int no_evict = 0;
    run_getopt(e.argc, e.argv, &listen, &ttl, &no_evict);
    assert_string_equal(listen, "cmd:2");
    assert_string_equal(ttl, "5");
    check_and_free(&e, in, ARGV("prog", "--listen=file:1", "--lease-ttl=5", "--listen", "cmd:2"));

    in = ARGV("prog", "--config", (char *)path, "--lease-ttl=6");
    expand(in, "master", &e);
    assert_int_equal(e.status, KVP_OK);
    listen = ttl = NULL;
    run_getopt(e.argc, e.argv, &listen, &ttl, &no_evict);
    assert_string_equal(listen, "file:1");
    assert_string_equal(ttl, "6");
    kvp_conf_free_argv(e.argv, in);
}

static void test_booleans(void **state)
{
    (void)state;
    static const char *const on[] = {"true", "yes", "on", "1", "TRUE", "Yes"};
    static const char *const off[] = {"false", "no", "off", "0", "False", "OFF"};
    for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
        char text[64];
        snprintf(text, sizeof(text), "no-eviction = %s\nlisten = a:1\n", on[i]);
        const char *path = write_conf(text);
        char **in = ARGV("prog", "--config", (char *)path);
        expanded_t e;
        expand(in, "master", &e);
        check_and_free(&e, in, ARGV("prog", "--no-eviction", "--listen=a:1"));
        remove_files(NULL);
    }
    for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); i++) {
        char text[64];
        snprintf(text, sizeof(text), "no-eviction = %s\nlisten = a:1\n", off[i]);
        const char *path = write_conf(text);
        char **in = ARGV("prog", "--config", (char *)path);
        expanded_t e;
        expand(in, "master", &e);
        check_and_free(&e, in, ARGV("prog", "--listen=a:1"));
        remove_files(NULL);
    }
    static const char *const bad[] = {"maybe", "", "2", "truee", "on off"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[64];
        snprintf(text, sizeof(text), "listen = a:1\nno-eviction = %s\n", bad[i]);
        const char *path = write_conf(text);
        char **in = ARGV("prog", "--config", (char *)path);
        expanded_t e;
        expand(in, "master", &e);
        char rest[128];
        snprintf(rest, sizeof(rest),
                 "'no-eviction' is a switch: true or false (yes/no, on/off, 1/0), not '%s'",
                 bad[i]);
        check_file_error(&e, path, 2, rest);
        remove_files(NULL);
    }
}

static void test_optional_argument(void **state)
{
    (void)state;
    const char *path = write_conf("verbose = 2\n"
                                  "verbose =\n");
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_and_free(&e, in, ARGV("prog", "--verbose=2", "--verbose"));
}

static const char sections_text[] = "lease-ttl = 1\n"
                                    "[serve]\n"
                                    "listen = serve:1\n"
                                    "no-eviction = yes\n"
                                    "[master]\n"
                                    "listen = master:1\n"
                                    "[ serve ]\n"
                                    "name = s\n"
                                    "[ master ]\n"
                                    "name = m\n"
                                    "[other]\n"
                                    "not-a-flag = 1\n";

static void test_sections(void **state)
{
    (void)state;
    const char *path = write_conf(sections_text);
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_and_free(&e, in, ARGV("prog", "--lease-ttl=1", "--listen=master:1", "--name=m"));
    expand(in, "serve", &e);
    check_and_free(&e, in,
                   ARGV("prog", "--lease-ttl=1", "--listen=serve:1", "--no-eviction", "--name=s"));
    /* a program whose section is in no header reads only the keys before the first */
    expand(in, "bench", &e);
    check_and_free(&e, in, ARGV("prog", "--lease-ttl=1"));
}

static void test_unknown_key(void **state)
{
    (void)state;
    const char *path = write_conf("listen = a:1\n"
                                  "\n"
                                  "# a comment\n"
                                  "bogus = 1\n"
                                  "also-bogus = 2\n");
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_file_error(&e, path, 4, "unknown key 'bogus' (not a flag of this program)");

    /* keys are whole flag names: no abbreviations, no dashes */
    path = write_conf("[master]\nlist = a:1\n");
    in = ARGV("prog", "--config", (char *)path);
    expand(in, "master", &e);
    check_file_error(&e, path, 2, "unknown key 'list' (not a flag of this program)");
    path = write_conf("--listen = a:1\n");
    in = ARGV("prog", "--config", (char *)path);
    expand(in, "master", &e);
    check_file_error(&e, path, 1, "unknown key '--listen' (not a flag of this program)");
}

static void test_config_key_refused(void **state)
{
    (void)state;
    const char *path = write_conf("listen = a:1\nconfig = /etc/other.conf\n");
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_file_error(&e, path, 2, "'config' cannot be set in a config file (one file, no nesting)");
}

static void test_missing_value(void **state)
{
    (void)state;
    const char *path = write_conf("; settings\n"
                                  "listen =   \n");
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_file_error(&e, path, 2, "'listen' needs a value (listen = VALUE)");
}

static void test_syntax_errors(void **state)
{
    (void)state;
    static const char want[] = "expected 'key = value', '[section]' or a comment ('#' or ';')";
    /* no '=' */
    const char *path = write_conf("listen = a:1\n"
                                  "lease-ttl 5\n"
                                  "name = n\n");
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_file_error(&e, path, 2, want);
    /* a section without its ']' */
    path = write_conf("listen = a:1\n\n[master\nname = n\n");
    in = ARGV("prog", "--config", (char *)path);
    expand(in, "master", &e);
    check_file_error(&e, path, 3, want);
    /* an indented line is not the continuation of the value above */
    path = write_conf("listen = a:1\n"
                      "    more words\n");
    in = ARGV("prog", "--config", (char *)path);
    expand(in, "master", &e);
    check_file_error(&e, path, 2, want);
}

static void test_missing_file(void **state)
{
    (void)state;
    char **in = ARGV("prog", "--config", "/nonexistent/kvpool.conf");
    expanded_t e;
    expand(in, "master", &e);
    check_error(&e, "cannot open config file /nonexistent/kvpool.conf: No such file or directory");

    char dir[] = "/tmp/kvp_test_conf_dir_XXXXXX";
    assert_non_null(mkdtemp(dir));
    in = ARGV("prog", "--config", dir);
    expand(in, "master", &e);
    rmdir(dir);
    char want[128];
    snprintf(want, sizeof(want), "%s:1: cannot read: %s", dir, strerror(EISDIR));
    check_error(&e, want);
}

static void test_config_twice_or_without_file(void **state)
{
    (void)state;
    const char *a = write_conf("listen = a:1\n");
    const char *b = write_conf("listen = b:1\n");
    char eq[128];
    snprintf(eq, sizeof(eq), "--config=%s", b);
    char **in = ARGV("prog", "--config", (char *)a, "--listen", "x:1", eq);
    expanded_t e;
    expand(in, "master", &e);
    char want[256];
    snprintf(want, sizeof(want), "--config given twice ('%s', then '%s'): give one file", a, b);
    check_error(&e, want);

    in = ARGV("prog", "--listen", "x:1", "--config");
    expand(in, "master", &e);
    check_error(&e, "--config needs a file name");
    in = ARGV("prog", "--config=", "--listen", "x:1");
    expand(in, "master", &e);
    check_error(&e, "--config needs a file name");
    in = ARGV("prog", "--config", "");
    expand(in, "master", &e);
    check_error(&e, "--config needs a file name");
}

static void test_config_as_value_of_another_option(void **state)
{
    (void)state;
    /* --name takes the next argument, whatever it looks like */
    char **in = ARGV("prog", "--name", "--config", "file");
    expanded_t e;
    expand(in, "master", &e);
    assert_int_equal(e.status, KVP_OK);
    assert_ptr_equal(e.argv, in);
    /* ... also when abbreviated, as getopt_long allows */
    in = ARGV("prog", "--na", "--config");
    expand(in, "master", &e);
    assert_int_equal(e.status, KVP_OK);
    assert_ptr_equal(e.argv, in);
    /* "--name=V" and a switch take no next argument; short options are taken to have none */
    const char *path = write_conf("lease-ttl = 3\n");
    in = ARGV("prog", "--name=--config", "--no-eviction", "-h", "--config", (char *)path, "op");
    expand(in, "master", &e);
    check_and_free(&e, in,
                   ARGV("prog", "--lease-ttl=3", "--name=--config", "--no-eviction", "-h", "op"));
    /* an optional argument is never the next argument */
    in = ARGV("prog", "--verbose", "--config", (char *)path);
    expand(in, "master", &e);
    check_and_free(&e, in, ARGV("prog", "--lease-ttl=3", "--verbose"));
    /* an abbreviation of --config is --config, as getopt_long would read it */
    in = ARGV("prog", "--conf", (char *)path);
    expand(in, "master", &e);
    check_and_free(&e, in, ARGV("prog", "--lease-ttl=3"));
}

static void test_double_dash(void **state)
{
    (void)state;
    /* after "--" everything is an operand */
    char **in = ARGV("prog", "--listen", "a:1", "--", "--config", "file");
    expanded_t e;
    expand(in, "master", &e);
    assert_int_equal(e.status, KVP_OK);
    assert_ptr_equal(e.argv, in);

    const char *path = write_conf("listen = f:1\n");
    in = ARGV("prog", "--config", (char *)path, "--", "--config", "other");
    expand(in, "master", &e);
    check_and_free(&e, in, ARGV("prog", "--listen=f:1", "--", "--config", "other"));
    /* "--" as the value of an option is that value, not the end of the options */
    in = ARGV("prog", "--name", "--", "--config", (char *)path);
    expand(in, "master", &e);
    check_and_free(&e, in, ARGV("prog", "--listen=f:1", "--name", "--"));
}

static void test_long_line(void **state)
{
    (void)state;
    /* inih's buffer is 200 bytes: a line of 199 is read whole, a longer one refused */
    char text[1024];
    char value[512];
    size_t vlen = 199 - strlen("name = ");
    memset(value, 'v', vlen);
    value[vlen] = '\0';
    snprintf(text, sizeof(text), "name = %s\n", value);
    const char *path = write_conf(text);
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    assert_int_equal(e.status, KVP_OK);
    assert_int_equal(e.argc, 2);
    assert_int_equal(strlen(e.argv[1]), strlen("--name=") + vlen);
    kvp_conf_free_argv(e.argv, in);

    /* 300 bytes: inih alone would read the tail as line 3 (and here as a key) */
    memset(value, 'v', 280);
    strcpy(value + 280, "lease-ttl = 5");
    snprintf(text, sizeof(text), "# long\nname = %s\nlisten = a:1\n", value);
    path = write_conf(text);
    in = ARGV("prog", "--config", (char *)path);
    expand(in, "master", &e);
    char rest[128];
    snprintf(rest, sizeof(rest), "line too long (%zu bytes; at most 199)",
             strlen("name = ") + strlen(value));
    check_file_error(&e, path, 2, rest);
}

static void test_comments(void **state)
{
    (void)state;
    const char *path = write_conf("# a comment\n"
                                  "; another\n"
                                  "   # indented\n"
                                  "listen = a:1 ; inline, after a blank\n"
                                  "name = x;y\n"
                                  "lease-ttl = 5 # '#' only at the start of a line\n"
                                  "#listen = commented:1\n");
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_and_free(&e, in,
                   ARGV("prog", "--listen=a:1", "--name=x;y",
                        "--lease-ttl=5 # '#' only at the start of a line"));
}

static void test_whitespace(void **state)
{
    (void)state;
    const char *path = write_conf("  \t listen\t=   127.0.0.1:1  \t\n"
                                  "    name = two words \r\n"
                                  "\t[master]  \n"
                                  "  no-eviction =   on\n"
                                  "lease-ttl=4\n"
                                  "ready-fd: 3\n"
                                  "   \n");
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_and_free(&e, in,
                   ARGV("prog", "--listen=127.0.0.1:1", "--name=two words", "--no-eviction",
                        "--lease-ttl=4", "--ready-fd=3"));
}

static void test_nul_byte(void **state)
{
    (void)state;
    const char *path = write_conf("listen = a:1\n");
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    fwrite("name = a\0b\n", 1, 11, f);
    fclose(f);
    char **in = ARGV("prog", "--config", (char *)path);
    expanded_t e;
    expand(in, "master", &e);
    check_file_error(&e, path, 2, "a NUL byte: not a text file");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_config_returns_argv),
        cmocka_unit_test_teardown(test_keys_in_file_order, remove_files),
        cmocka_unit_test_teardown(test_config_equals_form, remove_files),
        cmocka_unit_test_teardown(test_empty_file, remove_files),
        cmocka_unit_test_teardown(test_command_line_overrides_file, remove_files),
        cmocka_unit_test_teardown(test_booleans, remove_files),
        cmocka_unit_test_teardown(test_optional_argument, remove_files),
        cmocka_unit_test_teardown(test_sections, remove_files),
        cmocka_unit_test_teardown(test_unknown_key, remove_files),
        cmocka_unit_test_teardown(test_config_key_refused, remove_files),
        cmocka_unit_test_teardown(test_missing_value, remove_files),
        cmocka_unit_test_teardown(test_syntax_errors, remove_files),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test_teardown(test_config_twice_or_without_file, remove_files),
        cmocka_unit_test_teardown(test_config_as_value_of_another_option, remove_files),
        cmocka_unit_test_teardown(test_double_dash, remove_files),
        cmocka_unit_test_teardown(test_long_line, remove_files),
        cmocka_unit_test_teardown(test_comments, remove_files),
        cmocka_unit_test_teardown(test_whitespace, remove_files),
        cmocka_unit_test_teardown(test_nul_byte, remove_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
