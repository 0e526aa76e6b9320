/*
 * status_list.h - the one list of kvpool's status codes: name, number, text.
 *
 * Everything else is derived from it: the kvp_status_t enum of common/status.h,
 * the string table of kvp_strerror (common/status.c), the wire values (the
 * .proto carries the same numbers as int32) and the public enum that
 * client/include/kvpool_status.h presents to users (a checked-in copy,
 * compared with this list by tests/unit/common/test_status.c). 0 is success,
 * every failure is negative. The numbers are part of the wire protocol
 * (docs/protocol.md): never renumber an entry; append, and move
 * KVP_STATUS_MIN with it.
 *
 * Macros only: no types, no declarations, includes nothing.
 */
#ifndef KVP_COMMON_STATUS_LIST_H
#define KVP_COMMON_STATUS_LIST_H

/* X(name, value, message) */
#define KVP_STATUS_LIST(X)                                                                         \
    X(KVP_OK, 0, "success")                                                                        \
    X(KVP_ERR_INVALID_ARG, -1, "invalid argument")                                                 \
    X(KVP_ERR_NOMEM, -2, "out of memory")                                                          \
    X(KVP_ERR_NOT_FOUND, -3, "key not found")                                                      \
    X(KVP_ERR_EXISTS, -4, "key already exists")                                                    \
    X(KVP_ERR_POOL_FULL, -5, "pool full: no segment has room for the object")                      \
    X(KVP_ERR_TOO_LARGE, -6, "object larger than any mounted segment")                             \
    X(KVP_ERR_NO_SEGMENT, -7, "no segment mounted in the pool")                                    \
    X(KVP_ERR_BUFFER_TOO_SMALL, -8, "destination buffer smaller than the object")                  \
    X(KVP_ERR_CHECKSUM, -9, "checksum mismatch: the bytes read are not the bytes written")         \
    X(KVP_ERR_BAD_KEY, -10, "invalid key: must be 1..4096 bytes of UTF-8 with no NUL")             \
    X(KVP_ERR_PENDING, -11, "object is being written (PENDING)")                                   \
    X(KVP_ERR_NOT_PENDING, -12, "object is not PENDING")                                           \
    X(KVP_ERR_CONNECT, -13, "cannot connect to peer")                                              \
    X(KVP_ERR_IO, -14, "I/O error on connection")                                                  \
    X(KVP_ERR_TIMEOUT, -15, "operation timed out")                                                 \
    X(KVP_ERR_PROTOCOL, -16, "protocol error: malformed or unexpected frame")                      \
    X(KVP_ERR_VERSION, -17, "protocol version mismatch")                                           \
    X(KVP_ERR_FRAME_TOO_LARGE, -18, "frame larger than the allowed maximum")                       \
    X(KVP_ERR_SEGMENT_GONE, -19, "segment is gone (unmounted or its owner died)")                  \
    X(KVP_ERR_OUT_OF_RANGE, -20, "extent outside the segment")                                     \
    X(KVP_ERR_TRANSPORT, -21, "transport unavailable for this peer")                               \
    X(KVP_ERR_UNKNOWN_METHOD, -22, "unknown RPC method")                                           \
    X(KVP_ERR_TOO_MANY, -23, "batch has too many entries")                                         \
    X(KVP_ERR_SYSTEM, -24, "system call failed")                                                   \
    X(KVP_ERR_SHUTDOWN, -25, "shutting down")                                                      \
    X(KVP_ERR_NOT_OWNER, -26, "caller does not own this object or segment")                        \
    X(KVP_ERR_INTERNAL, -27, "internal error")                                                     \
    X(KVP_ERR_LEASED, -28, "object is being read (under a read lease); remove it with force")      \
    X(KVP_ERR_LEASE_EXPIRED, -29, "read lease expired before the transfer finished")               \
    X(KVP_ERR_POOL_BUSY, -30,                                                                      \
      "pool full for now: the room is held by reads in flight (the client waits and retries)")     \
    X(KVP_ERR_NO_REPLICA, -31, "no replica of the object could be reached (every copy failed)")    \
    X(KVP_ERR_UNKNOWN_SEGMENT, -32,                                                                \
      "the master named a segment this client has no descriptor for")                              \
    X(KVP_ERR_PUT_REVOKED, -33,                                                                    \
      "the put was revoked before it ended (master restart, lost connection, segment gone or "     \
      "put timeout): nothing is stored, retry")                                                    \
    X(KVP_ERR_IN_USE, -34, "in use by another live process (an SSD segment file is locked)")       \
    X(KVP_ERR_UNSUPPORTED, -35,                                                                    \
      "not supported here (e.g. a filesystem without O_DIRECT for an SSD segment)")                \
    X(KVP_ERR_NO_SPACE, -36, "no space left on the SSD segment's disk or in its object table")     \
    X(KVP_ERR_NOT_LEADER, -37,                                                                     \
      "this master is not the leader (a standby, or a leader that lost its lease): the client "    \
      "follows the leader through etcd")                                                           \
    X(KVP_ERR_DENIED, -38,                                                                         \
      "refused: the peer does not allow this caller (protected mode takes its own host only: "     \
      "--auth none, or KVPOOL_AUTH=none, on a trusted network; with TLS and an ACL, the "          \
      "caller's principal lacks the role or the key)")                                             \
    X(KVP_ERR_QUOTA, -39,                                                                          \
      "over quota: the caller's tenant holds as many bytes or objects as its quota allows "        \
      "(the master's message says which; remove some, or raise max-dram, max-ssd or "              \
      "max-objects in the ACL's [tenant NAME] section)")

/* Most negative defined status: the range check for values off the wire. */
#define KVP_STATUS_MIN (-39)

#endif
