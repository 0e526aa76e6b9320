/*
 * test_main.c - indexer/main.c: every way kvpool-indexer can fail to start frees what it
 * made before (the index, the TLS context, the ACL, the CURVE secret), and a clean stop
 * too. The binary itself runs (KVPOOL_INDEXER_BIN), with TLS and an ACL so that each exit
 * has them to undo; under ASan (LeakSanitizer) an exit that leaks one ends with another
 * status than its own, which fails here. (The subscriber thread failing to start is left
 * out: nothing makes it fail from outside.)
 *
 * Certificates: deploy/make-certs.sh into a temporary folder (KVPOOL_SOURCE_ROOT).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];
static const char *bin;

static int setup(void **state)
{
    (void)state;
    const char *root = getenv("KVPOOL_SOURCE_ROOT");
    bin = getenv("KVPOOL_INDEXER_BIN");
    snprintf(dir, sizeof(dir), "/tmp/kvp-test-indexer-main-XXXXXX");
    if (root == NULL || bin == NULL || mkdtemp(dir) == NULL)
        return -1;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "bash %s/deploy/make-certs.sh %s >/dev/null 2>&1 && cd %s && "
             "printf '[principal admin]\\nroles = admin\\ncert-cn = admin\\n' >acl.conf && "
             "touch a-file && mkdir state && printf 'not json' >state/registrations.json",
             root, dir, dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Run the indexer with TLS, the ACL and extra (NULL-ended): its wait status; its stderr in
 * err. With ready (the ready line's buffer): stopped with SIGTERM once it is ready. */
static int run(const char *const *extra, char *err, size_t err_len, char *ready, size_t ready_len)
{
    char cert[128], key[128], ca[128], acl[128], errf[128];
    snprintf(cert, sizeof(cert), "%s/server.crt", dir);
    snprintf(key, sizeof(key), "%s/server.key", dir);
    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    snprintf(acl, sizeof(acl), "%s/acl.conf", dir);
    snprintf(errf, sizeof(errf), "%s/stderr", dir);
    const char *argv[32] = {bin, "--tls-cert", cert, "--tls-key",  key, "--tls-ca",
                            ca,  "--acl-file", acl,  "--ready-fd", "3"};
    size_t n = 11;
    for (size_t i = 0; extra[i] != NULL && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int e = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (e < 0 || dup2(e, 2) < 0 || dup2(fds[1], 3) < 0)
            _exit(127);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    if (ready != NULL) {
        ssize_t got = read(fds[0], ready, ready_len - 1);
        ready[got > 0 ? got : 0] = '\0';
        kill(pid, SIGTERM);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(fds[0]);
    FILE *f = fopen(errf, "r");
    size_t len = f != NULL ? fread(err, 1, err_len - 1, f) : 0;
    err[len] = '\0';
    if (f != NULL)
        fclose(f);
    return status;
}

/* Each failed start: its exit status (its own, not ASan's) and its reason. */
static void test_failed_starts(void **state)
{
    (void)state;
    char file[128], state_dir[128], under_file[160], missing[128];
    snprintf(file, sizeof(file), "%s/a-file", dir);
    snprintf(state_dir, sizeof(state_dir), "%s/state", dir);
    snprintf(under_file, sizeof(under_file), "%s/a-file/state", dir);
    snprintf(missing, sizeof(missing), "%s/no-such-file", dir);
    const struct {
        const char *args[4];
        int code;
        const char *says;
    } cases[] = {
        {{"--curve-secret", missing, NULL}, 2, "--curve-secret"},
        {{"--state-dir", under_file, NULL}, 2, "--state-dir"},
        {{"--state-dir", state_dir, NULL}, 2, "cannot be read back"},
        {{"--config", missing, NULL}, 2, "--config"},
        {{"--config", file, NULL}, 2, "--config"}, /* empty: not a JSON object */
        {{"--listen", "192.0.2.1:1", NULL}, 1, "cannot listen"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[4096];
        int st = run(cases[i].args, err, sizeof(err), NULL, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != cases[i].code ||
            strstr(err, cases[i].says) == NULL)
            fail_msg("%s %s: status %#x (want exit %d saying %s): %s", cases[i].args[0],
                     cases[i].args[1], st, cases[i].code, cases[i].says, err);
    }
}

/* Started, then stopped: exit 0. */
static void test_clean_stop(void **state)
{
    (void)state;
    static const char *const args[] = {"--listen", "127.0.0.1:0", NULL};
    char err[4096], ready[300];
    int st = run(args, err, sizeof(err), ready, sizeof(ready));
    if (strncmp(ready, "127.0.0.1:", 10) != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("ready '%s', status %#x: %s", ready, st, err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_starts),
        cmocka_unit_test(test_clean_stop),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
