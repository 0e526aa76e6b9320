/*
 * status.c - the string table of kvp_status_t (from KVP_STATUS_LIST) and the
 * errno -> status conversion used at the syscall boundary.
 *
 * Thread-safe, no state.
 */
#include "common/status.h"

#include <stdbool.h>

#include <stdarg.h>
#include <stdio.h>

#include <errno.h>

const char *kvp_strerror(kvp_status_t status)
{
    switch (status) {
#define KVP_STATUS_CASE_(name, value, msg)                                                         \
    case name:                                                                                     \
        return msg;
        KVP_STATUS_LIST(KVP_STATUS_CASE_)
#undef KVP_STATUS_CASE_
    }
    return "unknown status";
}

kvp_status_t kvp_status_from_wire(int32_t status)
{
    switch (status) {
#define KVP_STATUS_CASE_(name, value, msg)                                                         \
    case name:                                                                                     \
        return name;
        KVP_STATUS_LIST(KVP_STATUS_CASE_)
#undef KVP_STATUS_CASE_
    }
    return KVP_ERR_PROTOCOL;
}

kvp_status_t kvp_status_from_errno(int err)
{
    switch (err) {
    case 0:
        return KVP_OK;
    case ENOMEM:
    case ENOBUFS:
        return KVP_ERR_NOMEM;
    case ETIMEDOUT:
    case EAGAIN:
        return KVP_ERR_TIMEOUT;
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EADDRNOTAVAIL:
        return KVP_ERR_CONNECT;
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED:
        return KVP_ERR_IO;
    case EINVAL:
        return KVP_ERR_INVALID_ARG;
    default:
        return KVP_ERR_SYSTEM;
    }
}

void kvp_errf(char *err, size_t err_len, const char *fmt, ...)
{
    if (err == NULL || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static __thread char note_text[512];
static __thread bool note_set;

void kvp_status_note(const char *text)
{
    snprintf(note_text, sizeof(note_text), "%s", text);
    note_set = true;
}

const char *kvp_status_note_take(void)
{
    if (!note_set)
        return NULL;
    note_set = false;
    return note_text;
}
