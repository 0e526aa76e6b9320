/*
 * progress.h - progress of the CLI's long work (drain, bulk remove, large puts and gets)
 * on stderr: a bar redrawn in place on a terminal, plain lines otherwise (logs, pipes,
 * CI), see progress.c.
 */
#ifndef KVP_CLIENT_TOOLS_CLI_PROGRESS_H
#define KVP_CLIENT_TOOLS_CLI_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvp_progress kvp_progress_t;

/* How progress is drawn: a bar when stderr is a terminal, else a line every few seconds. */
#define KVP_PROGRESS_AUTO 0
#define KVP_PROGRESS_TTY 1   /* a bar, redrawn in place */
#define KVP_PROGRESS_LINES 2 /* plain lines */

/*
 * Start reporting `what` ("put model.bin", "drain seg-a") on stderr: total units to do
 * (0: not known, only the elapsed time is shown until the end), counted in bytes (shown
 * as KiB/MiB/...) when `bytes`, else in `unit` ("objects", "keys"). style:
 * KVP_PROGRESS_AUTO (isatty(stderr)), _TTY or _LINES. Plain lines come at the start,
 * every interval_ms (0: 2000) and at the end. A reporter thread draws; the caller only
 * stores numbers. NULL when no thread could be made: every call below accepts NULL.
 */
kvp_progress_t *kvp_progress_start(const char *what, uint64_t total, bool bytes, const char *unit,
                                   int style, unsigned interval_ms);
/* Units done so far (any thread; a relaxed store). */
void kvp_progress_set(kvp_progress_t *p, uint64_t done);
/* The total once it is known (or changed). */
void kvp_progress_set_total(kvp_progress_t *p, uint64_t total);
/* Start a new phase under another name ("write out.bin"), done reset to 0. */
void kvp_progress_phase(kvp_progress_t *p, const char *what, uint64_t total);
/* Stop the thread, draw the last state with `result` ("done", "failed") and free. */
void kvp_progress_end(kvp_progress_t *p, const char *result);

/* "1.5 GiB"; below 1 KiB "512 B". */
const char *kvp_progress_size(uint64_t bytes, char *buf, unsigned long len);

#endif
