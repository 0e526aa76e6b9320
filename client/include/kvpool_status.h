/*
 * kvpool_status.h - status codes shared by libkvpool, the daemons and the wire.
 *
 * Installed with kvpool.h. 0 is success, every failure is negative;
 * kvp_strerror() gives each one's text. The numbers are part of the wire
 * protocol (docs/protocol.md): append only.
 *
 * Maintainers: this enum is a checked-in copy of KVP_STATUS_LIST in
 * common/status_list.h, the one source of the numbers and their text.
 * Add a status there first, then here; tests/unit/common/test_status.c
 * fails while the two differ (a name, a number, one missing on either side).
 */
#ifndef KVPOOL_STATUS_H
#define KVPOOL_STATUS_H

#ifndef KVP_STATUS_T_DEFINED
#define KVP_STATUS_T_DEFINED
typedef enum kvp_status {
    KVP_OK = 0,
    KVP_ERR_INVALID_ARG = -1,
    KVP_ERR_NOMEM = -2,
    KVP_ERR_NOT_FOUND = -3,
    KVP_ERR_EXISTS = -4,
    KVP_ERR_POOL_FULL = -5,
    KVP_ERR_TOO_LARGE = -6,
    KVP_ERR_NO_SEGMENT = -7,
    KVP_ERR_BUFFER_TOO_SMALL = -8,
    KVP_ERR_CHECKSUM = -9,
    KVP_ERR_BAD_KEY = -10,
    KVP_ERR_PENDING = -11,
    KVP_ERR_NOT_PENDING = -12,
    KVP_ERR_CONNECT = -13,
    KVP_ERR_IO = -14,
    KVP_ERR_TIMEOUT = -15,
    KVP_ERR_PROTOCOL = -16,
    KVP_ERR_VERSION = -17,
    KVP_ERR_FRAME_TOO_LARGE = -18,
    KVP_ERR_SEGMENT_GONE = -19,
    KVP_ERR_OUT_OF_RANGE = -20,
    KVP_ERR_TRANSPORT = -21,
    KVP_ERR_UNKNOWN_METHOD = -22,
    KVP_ERR_TOO_MANY = -23,
    KVP_ERR_SYSTEM = -24,
    KVP_ERR_SHUTDOWN = -25,
    KVP_ERR_NOT_OWNER = -26,
    KVP_ERR_INTERNAL = -27,
    KVP_ERR_LEASED = -28,
    KVP_ERR_LEASE_EXPIRED = -29,
    KVP_ERR_POOL_BUSY = -30,
    KVP_ERR_NO_REPLICA = -31,
    KVP_ERR_UNKNOWN_SEGMENT = -32,
    KVP_ERR_PUT_REVOKED = -33,
    KVP_ERR_IN_USE = -34,
    KVP_ERR_UNSUPPORTED = -35,
    KVP_ERR_NO_SPACE = -36,
    KVP_ERR_NOT_LEADER = -37,
    KVP_ERR_DENIED = -38,
    KVP_ERR_QUOTA = -39,
} kvp_status_t;
#endif

/* Most negative defined status: the range check for values off the wire. */
#define KVP_STATUS_MIN (-39)

/*
 * Human-readable text for a status. Always returns a static string, also for
 * values that are not in the list ("unknown status").
 */
const char *kvp_strerror(kvp_status_t status);

#endif
