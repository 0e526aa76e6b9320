/*
 * decode.h - KV event batches off the wire (msgpack) into index ops (decode.c).
 *
 * Thread: a decoder is its caller's (the subscriber thread's). A decoded batch's hashes
 * and token ids are in the decoder's arrays until the next decode.
 */
#ifndef KVP_INDEXER_DECODE_H
#define KVP_INDEXER_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "indexer/index.h"

#define KVP_DECODE_EVENTS_MAX (1u << 20) /* events in one batch */

typedef struct kvp_decoder {
    const uint8_t *buf; /* the payload decoded last (borrowed) */
    size_t len;
    kvp_idx_op_t *ops;
    size_t n_ops, cap_ops;
    uint64_t *hv; /* the batch's hashes and token ids, read once (ops index them) */
    uint32_t *tv;
    size_t n_hv, cap_hv, n_tv, cap_tv;
    bool oom;
    size_t unknown; /* events of a tag we do not know, skipped */
} kvp_decoder_t;

void kvp_decoder_init(kvp_decoder_t *d);
void kvp_decoder_cleanup(kvp_decoder_t *d);

/*
 * Decode a whole batch (docs/indexer.md, "Events in") from buf[0..len) into *b, whose
 * callbacks read the ops' hashes and tokens from buf (which must stay as it is until the
 * batch is applied). KVP_ERR_PROTOCOL with a sentence in why when anything in it is
 * malformed: nothing of it may be applied then. KVP_ERR_NOMEM when the ops do not fit.
 */
kvp_status_t kvp_decode_batch(kvp_decoder_t *d, const uint8_t *buf, size_t len, kvp_idx_batch_t *b,
                              char *why, size_t why_len);

#endif
