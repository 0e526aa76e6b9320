/*
 * status.h - the one status enum of kvpool.
 *
 * Every fallible function returns kvp_status_t: 0 is success, negative is
 * failure. The list below is the single source of truth: the enum, the
 * string table (kvp_strerror) and the wire values (the .proto carries the
 * same numbers as int32) all come from it. Never renumber an entry; append.
 */
#ifndef KVP_COMMON_STATUS_H
#define KVP_COMMON_STATUS_H

#include "client/include/kvpool_status.h"

#endif
