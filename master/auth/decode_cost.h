/*
 * decode_cost.h - what decoding a request body would cost the master, judged from the
 * wire before protobuf-c allocates anything (docs/security.md, "Admission limits").
 *
 * protobuf-c's unpack allocates per field it sees: a scan record for every field on the
 * wire, a copy of every unknown field with a record of it, an element per repeated entry,
 * a struct per sub-message. Two bytes on the wire (an empty key, an empty sub-message, an
 * unknown varint) can so cost 50 to 100 bytes of memory: a 60 MB frame of them took the
 * master's RSS past 3.5 GB and its loop for 8 s. A singular sub-message sent k times is
 * merged k - 1 times, each merge copying what the earlier ones held: k^2 work. kvp_decode_cost
 * walks the body's fields as protobuf-c would, counting what it would allocate, and stops at the
 * first limit:
 *
 *   - the estimate past KVP_DECODE_BUDGET(body_len) (16 MiB + 2 x the body: a batch of
 *     the most keys a request may name, 65 536, of any length fits under it);
 *   - more than KVP_DECODE_MAX_UNKNOWN unknown fields (a newer client adds a few, not
 *     thousands).
 *
 * A body the walk cannot read (a bad varint, a length past the end) is left to protobuf-c,
 * which refuses it: the walk stopped before any limit, so the decode costs no more.
 *
 * Thread: pure (no state).
 */
#ifndef KVP_MASTER_AUTH_DECODE_COST_H
#define KVP_MASTER_AUTH_DECODE_COST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#define KVP_DECODE_BUDGET(body_len) ((16ull << 20) + 2ull * (uint64_t)(body_len))
#define KVP_DECODE_MAX_UNKNOWN 1024u

typedef struct kvp_decode_cost {
    uint64_t bytes;   /* memory the decode would allocate (estimated; where the walk stopped) */
    uint64_t fields;  /* field occurrences, elements of packed fields included */
    uint64_t unknown; /* unknown fields */
} kvp_decode_cost_t;

/*
 * Walk body as a message of type desc. true: within the limits (or unreadable: protobuf-c
 * decides); false: over one, *cost where the walk stopped and why (a sentence) in why.
 */
bool kvp_decode_cost(const ProtobufCMessageDescriptor *desc, const uint8_t *body, size_t len,
                     kvp_decode_cost_t *cost, char *why, size_t why_len);

#endif
