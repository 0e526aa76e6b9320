/*
 * decode_cost.c - the cost of decoding a request, from the wire (see decode_cost.h).
 *
 * The model follows protobuf-c 1.x's unpack (protobuf-c.c): per message its struct; per
 * field occurrence a ScannedMember (32 bytes; past the first 16, in slabs that double);
 * per unknown field a
 * ProtobufCMessageUnknownField and a copy of its bytes; per repeated entry an element of
 * the field's array (a pointer for messages and strings, a ProtobufCBinaryData for bytes,
 * 4 or 8 bytes for scalars; a packed field's elements counted one by one); per string or
 * bytes value a copy (+1 for the NUL); per allocation MALLOC_OVERHEAD; and a singular
 * sub-message that comes again is merged into the earlier one (protobuf-c allocates arrays
 * for both's repeated fields): what the earlier ones cost, again, so k copies of one cost
 * k^2 (unpack's work grows so too: 40 000 of them are refused). It errs high: a request
 * the library sends costs well under the budget.
 */
#include "master/auth/decode_cost.h"

#include <stdio.h>

#define SCANNED_MEMBER 32u /* protobuf-c's record of a field on the wire */
#define SCAN_SLAB0 16u     /* ... the first 16 on its stack, then slabs of 32, 64, ... */
#define MALLOC_OVERHEAD 16u
#define MAX_DEPTH 32u
#define MAX_FIELDS 64u

typedef struct walk {
    kvp_decode_cost_t *c;
    uint64_t budget;
    bool over;
} walk_t;

/* -1: malformed (protobuf-c refuses it) */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << (shift < 64 ? shift : 63);
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

static unsigned scalar_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
    case PROTOBUF_C_TYPE_STRING:  /* char * */
    case PROTOBUF_C_TYPE_MESSAGE: /* a pointer */
        return 8;
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default:
        return 4;
    }
}

/* Elements in a packed run of a scalar type. */
static uint64_t packed_count(ProtobufCType t, const uint8_t *v, size_t len)
{
    switch (t) {
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return len / 4;
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return len / 8;
    default: {
        uint64_t n = 0;
        for (size_t i = 0; i < len; i++)
            n += !(v[i] & 0x80);
        return n;
    }
    }
}

static bool add(walk_t *w, uint64_t bytes)
{
    w->c->bytes += bytes;
    if (w->c->bytes > w->budget || w->c->unknown > KVP_DECODE_MAX_UNKNOWN)
        w->over = true;
    return !w->over;
}

/* 0: walked (or stopped over a limit: w->over); -1: malformed */
static int walk_message(walk_t *w, const ProtobufCMessageDescriptor *d, const uint8_t *p,
                        const uint8_t *end, unsigned depth)
{
    uint64_t arrays = 0; /* one array per repeated field (at most) */
    for (unsigned i = 0; i < d->n_fields; i++)
        arrays += d->fields[i].label == PROTOBUF_C_LABEL_REPEATED;
    /* a singular sub-message seen again is merged into the one before (merge_messages:
     * new arrays for both's repeated fields): what the earlier ones cost, per field */
    uint64_t merged[MAX_FIELDS] = {0};
    if (depth > MAX_DEPTH || !add(w, d->sizeof_message + MALLOC_OVERHEAD * (1 + arrays)))
        return 0;
    uint64_t unknowns = 0, members = 0, slab_cap = SCAN_SLAB0, slab = 2 * SCAN_SLAB0;
    while (p < end) {
        uint64_t tag, len = 0;
        if (read_varint(&p, end, &tag) != 0)
            return -1;
        const uint8_t *v = p, *value = p; /* value: with its length prefix */
        switch (tag & 7) {
        case 0:
            if (read_varint(&p, end, &len) != 0)
                return -1;
            len = (uint64_t)(p - v);
            break;
        case 1:
            len = 8;
            break;
        case 5:
            len = 4;
            break;
        case 2:
            if (read_varint(&p, end, &len) != 0)
                return -1;
            v = p;
            break;
        default:
            return -1; /* groups: protobuf-c refuses them */
        }
        if (len > (uint64_t)(end - v))
            return -1;
        p = v + len;
        w->c->fields++;
        if (++members > slab_cap) { /* the next slab of scan records, twice the last */
            if (!add(w, slab * SCANNED_MEMBER + MALLOC_OVERHEAD))
                return 0;
            slab_cap += slab;
            slab *= 2;
        }
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3));
        if (f == NULL) {
            if (!add(w, unknowns++ == 0 ? MALLOC_OVERHEAD : 0)) /* their array */
                return 0;
            w->c->unknown++;
            if (!add(w, sizeof(ProtobufCMessageUnknownField) + (uint64_t)(p - value) +
                            MALLOC_OVERHEAD))
                return 0;
            continue;
        }
        bool rep = f->label == PROTOBUF_C_LABEL_REPEATED;
        uint64_t elem = rep ? scalar_size(f->type) : 0;
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            if ((tag & 7) != 2)
                return -1;
            if (!add(w, elem))
                return 0;
            uint64_t before = w->c->bytes;
            int r = walk_message(w, f->descriptor, v, v + len, depth + 1);
            if (r != 0 || w->over)
                return r;
            if (!rep) {
                size_t fi = (size_t)(f - d->fields);
                uint64_t sub = w->c->bytes - before;
                uint64_t *acc = fi < MAX_FIELDS ? &merged[fi] : &merged[MAX_FIELDS - 1];
                if (*acc > 0 && !add(w, *acc + sub))
                    return 0;
                *acc += sub;
            }
        } else if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES) {
            if (!add(w, elem + len + 1 + MALLOC_OVERHEAD))
                return 0;
        } else if (rep && (tag & 7) == 2) {
            uint64_t n = packed_count(f->type, v, len);
            w->c->fields += n;
            if (!add(w, n * elem))
                return 0;
        } else if (!add(w, elem)) {
            return 0;
        }
    }
    return 0;
}

bool kvp_decode_cost(const ProtobufCMessageDescriptor *desc, const uint8_t *body, size_t len,
                     kvp_decode_cost_t *cost, char *why, size_t why_len)
{
    *cost = (kvp_decode_cost_t){0};
    static const uint8_t empty[1];
    if (body == NULL) /* a frame without a body: no arithmetic on NULL, even + 0 */
        body = empty;
    walk_t w = {.c = cost, .budget = KVP_DECODE_BUDGET(len)};
    (void)walk_message(&w, desc, body, body + len, 0);
    if (!w.over)
        return true;
    if (cost->unknown > KVP_DECODE_MAX_UNKNOWN)
        snprintf(why, why_len,
                 "more than %u unknown fields in a %s of %zu bytes: refused before decoding",
                 KVP_DECODE_MAX_UNKNOWN, desc->short_name, len);
    else
        snprintf(why, why_len,
                 "a %s of %zu bytes would take more than %llu bytes to decode (%llu fields "
                 "read so far): refused before decoding",
                 desc->short_name, len, (unsigned long long)w.budget,
                 (unsigned long long)cost->fields);
    return false;
}
