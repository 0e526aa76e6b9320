/*
 * last_error.c - kvp_client_last_error(): what the calling thread's last
 * failed call was about, in words.
 *
 * Design: one thread-local record. Every public entry point brackets its
 * work with kvp_api_enter()/kvp_api_leave(); nested public calls (kvp_put
 * calls kvp_batch_put_from) count depth, so only the outermost call starts
 * and ends a record. While a call runs, code that knows more (which key,
 * which segment, which setting) notes it with kvp_api_fail() or, for one
 * key, kvp_api_fail_key(); the first note wins. A batch names the first
 * key that finally failed with kvp_api_fail_keys(): a note about another
 * key (a replica that failed before another one served the read) gives way
 * to it. When the outermost call returns a failure the note becomes the
 * thread's text (or, with no note, "<op>: <status text>"); when it
 * succeeds the note is dropped and the text stays as it was, like errno.
 *
 * Thread: any; nothing is shared between threads.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <stdbool.h>

#include "client/api.h"
#include "client/mem/scratch.h"
#include "common/status.h"

static _Thread_local struct {
    char text[512];  /* the last failure's, returned to the user */
    char note[512];  /* the current call's, until it returns */
    const void *key; /* the key the note is about; NULL: the whole call */
    unsigned depth;
    bool noted;
} tl;

void kvp_api_enter(void)
{
    if (tl.depth++ == 0) {
        (void)kvp_status_note_take(); /* a refusal of an earlier call */
        tl.noted = false;
        tl.key = NULL;
    }
}

int64_t kvp_api_leave(int64_t rc, const char *op)
{
    if (tl.depth > 0)
        tl.depth--;
    if (tl.depth == 0)
        kvp_scratch_release(0); /* the call's per-batch state */
    if (tl.depth > 0 || rc >= 0)
        return rc;
    const char *peer = kvp_status_note_take(); /* the master's own words, when it refused */
    if (tl.noted && !(peer != NULL && rc == KVP_ERR_DENIED))
        memcpy(tl.text, tl.note, sizeof(tl.text));
    else if (peer != NULL)
        snprintf(tl.text, sizeof(tl.text), "%s: %s", op, peer);
    else
        snprintf(tl.text, sizeof(tl.text), "%s: %s", op, kvp_strerror((kvp_status_t)rc));
    return rc;
}

static void note(const void *key, const char *fmt, va_list ap)
{
    if (tl.noted)
        return;
    vsnprintf(tl.note, sizeof(tl.note), fmt, ap);
    tl.noted = true;
    tl.key = key;
}

void kvp_api_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note(NULL, fmt, ap);
    va_end(ap);
}

void kvp_api_fail_key(const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note(key, fmt, ap);
    va_end(ap);
}

void kvp_api_fail_keys(const char *op, const char *const *keys, const int32_t *st, size_t n)
{
    size_t i = 0;
    while (i < n && st[i] >= 0)
        i++;
    if (i == n || (tl.noted && (tl.key == NULL || tl.key == keys[i])))
        return;
    snprintf(tl.note, sizeof(tl.note), "%s %s: %s", op, keys[i], kvp_strerror((kvp_status_t)st[i]));
    tl.noted = true;
    tl.key = keys[i];
}

const char *kvp_client_last_error(void)
{
    return tl.text[0] != '\0' ? tl.text : "no failure on this thread";
}
