/*
 * status.h - the one status type of kvpool and errno conversion.
 *
 * Every fallible function returns kvp_status_t: 0 is success, negative is
 * failure. The enum and the strings come from KVP_STATUS_LIST
 * (common/status_list.h). client/include/kvpool_status.h presents the same
 * enum to users; both define it under one guard (KVP_STATUS_T_DEFINED), so
 * a file that includes both gets one definition, and test_status.c keeps
 * the two identical.
 */
#ifndef KVP_COMMON_STATUS_H
#define KVP_COMMON_STATUS_H

#include <stdint.h>

#include "common/status_list.h"

#ifndef KVP_STATUS_T_DEFINED
#define KVP_STATUS_T_DEFINED
typedef enum kvp_status {
#define KVP_STATUS_ENUM_(name, value, msg) name = value,
    KVP_STATUS_LIST(KVP_STATUS_ENUM_)
#undef KVP_STATUS_ENUM_
} kvp_status_t;
#endif

/*
 * Human-readable text for a status. Always returns a static string, also for
 * values that are not in the list ("unknown status").
 */
const char *kvp_strerror(kvp_status_t status);

/* A status a peer sent on the wire, as a status: itself when it is one of the list, else
 * (a positive value, an unknown code) KVP_ERR_PROTOCOL: a peer never makes a caller see
 * success or a code it does not know. */
kvp_status_t kvp_status_from_wire(int32_t status);

/* Map an errno value to a status (ENOMEM, ETIMEDOUT, ECONNREFUSED, ...). */
kvp_status_t kvp_status_from_errno(int err);

#include <stddef.h>

/*
 * The calling thread's note of why a peer refused its last request (the text a master
 * sends with a frame-level error), for the API's last-error text: set by whoever reads
 * the refusal for this thread; taken (and cleared) by the API when the call fails.
 */
void kvp_status_note(const char *text);
/* The note, or NULL; clears it. */
const char *kvp_status_note_take(void);
/* Write a message into a caller's err buffer (printf format); NULL or 0-length: none. */
void kvp_errf(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
