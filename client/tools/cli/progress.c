/*
 * progress.c - progress of the CLI's long work on stderr.
 *
 * Design: the command stores how far it is (a relaxed atomic) and never draws; one
 * reporter thread per progress draws on a clock: on a terminal a one-line bar redrawn in
 * place ("\r", clear to end of line) every 100 ms; otherwise (a log file, a pipe, CI) a
 * plain line at the start, every interval and at the end, so a log shows the work is
 * alive without being flooded. A total of 0 means "not known yet": the elapsed time and
 * a moving marker are shown instead of a percentage. The last line always ends with a
 * newline and the result, so what follows on stderr starts on a line of its own.
 *
 * Thread: the command's thread calls everything; the reporter thread only reads the
 * numbers and the name (under the lock, which the phase change takes to swap them).
 */
#include "client/tools/cli/progress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

struct kvp_progress {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;
    bool tty;
    bool bytes;
    unsigned interval_ms;
    char what[256];
    char unit[32];
    _Atomic uint64_t done, total;
    uint64_t t0_ms;
    unsigned tick;
};

const char *kvp_progress_size(uint64_t bytes, char *buf, unsigned long len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

/* "3.0 GiB" or "1200 objects" */
static const char *amount(const kvp_progress_t *p, uint64_t n, char *buf, size_t len)
{
    if (p->bytes)
        return kvp_progress_size(n, buf, len);
    snprintf(buf, len, "%llu %s", (unsigned long long)n, p->unit);
    return buf;
}

/* One report, the lock held. result: NULL while running. */
static void draw(kvp_progress_t *p, const char *result)
{
    uint64_t done = atomic_load_explicit(&p->done, memory_order_relaxed);
    uint64_t total = atomic_load_explicit(&p->total, memory_order_relaxed);
    double secs = (double)(kvp_now_ms() - p->t0_ms) / 1000.0;
    char a[80], b[80], rate[80] = "";
    if (p->bytes && secs > 0.05 && done > 0) {
        char r[40];
        snprintf(rate, sizeof(rate), ", %s/s",
                 kvp_progress_size((uint64_t)((double)done / secs), r, sizeof(r)));
    }
    char line[1024];
    if (p->tty) {
        char bar[33];
        int width = 30;
        if (total > 0) {
            int fill = (int)((double)width * (double)(done > total ? total : done) / (double)total);
            for (int i = 0; i < width; i++)
                bar[i] = i < fill ? '#' : '.';
        } else {
            int at = (int)(p->tick % (unsigned)(2 * width - 2));
            if (at >= width)
                at = 2 * width - 2 - at;
            for (int i = 0; i < width; i++)
                bar[i] = i == at && result == NULL ? '#' : '.';
        }
        bar[width] = '\0';
        if (total > 0)
            snprintf(line, sizeof(line), "\r\033[K%s [%s] %3.0f%% %s of %s%s, %.1f s%s%s", p->what,
                     bar, 100.0 * (double)(done > total ? total : done) / (double)total,
                     amount(p, done, a, sizeof(a)), amount(p, total, b, sizeof(b)), rate, secs,
                     result ? ": " : "", result ? result : "");
        else
            snprintf(line, sizeof(line), "\r\033[K%s [%s] %s%s%s%.1f s%s%s", p->what, bar,
                     done > 0 ? amount(p, done, a, sizeof(a)) : "", rate, done > 0 ? ", " : "",
                     secs, result ? ": " : "", result ? result : "");
        fputs(line, stderr);
        if (result != NULL)
            fputc('\n', stderr);
    } else {
        if (total > 0)
            snprintf(line, sizeof(line), "kvpool: %s: %s of %s (%.0f%%)%s, %.1f s%s%s\n", p->what,
                     amount(p, done, a, sizeof(a)), amount(p, total, b, sizeof(b)),
                     100.0 * (double)(done > total ? total : done) / (double)total, rate, secs,
                     result ? ": " : "", result ? result : "");
        else
            snprintf(line, sizeof(line), "kvpool: %s: %s%s%.1f s%s%s\n", p->what,
                     done > 0 ? amount(p, done, a, sizeof(a)) : "", done > 0 ? ", " : "", secs,
                     result ? ": " : "", result ? result : "");
        fputs(line, stderr);
    }
    fflush(stderr);
}

static void *reporter(void *arg)
{
    kvp_progress_t *p = arg;
    unsigned step_ms = p->tty ? 100 : p->interval_ms;
    pthread_mutex_lock(&p->lock);
    if (!p->tty)
        draw(p, "started");
    while (!p->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)step_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&p->cond, &p->lock, &ts);
        if (p->stop)
            break;
        p->tick++;
        draw(p, NULL);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

kvp_progress_t *kvp_progress_start(const char *what, uint64_t total, bool bytes, const char *unit,
                                   int style, unsigned interval_ms)
{
    kvp_progress_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->tty = style == KVP_PROGRESS_TTY || (style == KVP_PROGRESS_AUTO && isatty(STDERR_FILENO));
    p->bytes = bytes;
    p->interval_ms = interval_ms > 0 ? interval_ms : 2000;
    snprintf(p->what, sizeof(p->what), "%s", what);
    snprintf(p->unit, sizeof(p->unit), "%s", unit != NULL ? unit : "");
    atomic_init(&p->done, 0);
    atomic_init(&p->total, total);
    p->t0_ms = kvp_now_ms();
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    if (pthread_create(&p->thread, NULL, reporter, p) != 0) {
        pthread_cond_destroy(&p->cond);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
    }
    return p;
}

void kvp_progress_set(kvp_progress_t *p, uint64_t done)
{
    if (p != NULL)
        atomic_store_explicit(&p->done, done, memory_order_relaxed);
}

void kvp_progress_set_total(kvp_progress_t *p, uint64_t total)
{
    if (p != NULL)
        atomic_store_explicit(&p->total, total, memory_order_relaxed);
}

void kvp_progress_phase(kvp_progress_t *p, const char *what, uint64_t total)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    draw(p, "done");
    snprintf(p->what, sizeof(p->what), "%s", what);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->total, total, memory_order_relaxed);
    p->t0_ms = kvp_now_ms();
    if (!p->tty)
        draw(p, "started");
    pthread_mutex_unlock(&p->lock);
}

void kvp_progress_end(kvp_progress_t *p, const char *result)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    draw(p, result != NULL ? result : "done");
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
