/*
 * call.c - the one response packer and what the handlers share.
 *
 * Design: handlers build a protobuf-c response that points into master
 * state and their own scratch arrays, and pack it here (through their
 * response builder, reply.c) before they return, so nothing in it outlives
 * the call; the dispatcher (dispatch.c) decodes
 * requests and frees them, so a handler neither unpacks nor frees. Every
 * batch RPC answers per key; a whole-request problem (too many keys,
 * mismatched array lengths) goes in the response's `status` with no
 * per-key results.
 *
 * Thread: master loop only.
 */
#include "master/rpc/call.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "common/grant.h"
#include "common/key.h"
#include "common/acl.h"

kvp_status_t kvp_call_reply(kvp_call_t *call, const ProtobufCMessage *msg)
{
    assert(call->resp_desc != NULL && msg->descriptor == call->resp_desc);
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *b = malloc(n ? n : 1);
    if (b == NULL)
        return KVP_ERR_NOMEM;
    protobuf_c_message_pack(msg, b);
    call->resp = b;
    call->resp_len = n;
    return KVP_OK;
}

void kvp_seg_desc_fill(Kvpool__SegmentDesc *d, const kvp_segment_t *seg)
{
    kvpool__segment_desc__init(d);
    d->id = seg->id;
    d->name = seg->name;
    d->medium = seg->medium;
    d->size = seg->size;
    d->owner_client_id = seg->owner_client_id;
    d->host_id = seg->host_id;
    d->tcp_endpoint = seg->tcp_endpoint;
    d->shm_path = seg->shm_path;
    d->rdma_endpoint = seg->rdma_endpoint;
    d->rdma_addr = seg->rdma_addr;
    /* data grants on: the rkey goes only to peers that proved an rdma key (the accept) */
    d->rdma_rkey = seg->grant_mac != NULL ? 0 : seg->rdma_rkey;
    d->grants = seg->grant_mac != NULL;
    d->rdma_windows = seg->rdma_windows && seg->grant_mac != NULL;
    d->draining = seg->draining;
}

bool kvp_call_owns_segment(const kvp_call_t *call, const kvp_segment_t *seg, bool admin)
{
    const kvp_principal_t *who = call->who;
    return who == NULL || (admin && (who->roles & KVP_ROLE_ADMIN)) || who->tag == seg->owner_tag;
}

void kvp_seg_desc_for_caller(const kvp_call_t *call, const kvp_segment_t *seg,
                             Kvpool__SegmentDesc *d)
{
    if (!kvp_call_owns_segment(call, seg, true))
        d->owner_client_id = 0;
}

/* An extent put in a grant set, with its descriptor's index. */
struct kvp_set_ext {
    size_t desc;
    kvp_grant_extent_t e;
};

bool kvp_seg_set_add(kvp_seg_set_t *s, const kvp_segment_t *seg, size_t *index_p)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->descs[i].id == seg->id) {
            if (index_p != NULL)
                *index_p = i;
            return true;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        Kvpool__SegmentDesc *d = realloc(s->descs, cap * sizeof(*d));
        uint32_t *sn = realloc(s->set_n, cap * sizeof(*sn));
        if (d != NULL)
            s->descs = d;
        if (sn != NULL)
            s->set_n = sn;
        if (d == NULL || sn == NULL)
            return false;
        s->cap = cap;
    }
    s->set_n[s->n] = 0;
    if (index_p != NULL)
        *index_p = s->n;
    kvp_seg_desc_fill(&s->descs[s->n++], seg);
    return true;
}

/* Seal each descriptor's grant set from the extents put in them (kvp_call_add_replicas):
 * one block of memory, the sets back to back, each extent at the index its replica names. */
static bool seal_sets(kvp_call_t *call, kvp_seg_set_t *s)
{
    kvp_master_state_t *st = call->st;
    size_t total = 0;
    for (size_t i = 0; i < s->n; i++)
        total += s->set_n[i] ? kvp_grant_set_len(s->set_n[i]) : 0;
    s->sets = malloc(total);
    size_t *at = malloc(s->n * sizeof(*at)); /* where each descriptor's next extent goes */
    if (s->sets == NULL || at == NULL) {
        free(at);
        return false;
    }
    size_t pos = 0;
    for (size_t i = 0; i < s->n; i++) {
        at[i] = pos + KVP_GRANT_SET_HDR_LEN;
        pos += s->set_n[i] ? kvp_grant_set_len(s->set_n[i]) : 0;
    }
    for (size_t k = 0; k < s->n_pend; k++) {
        memcpy(s->sets + at[s->pend[k].desc], &s->pend[k].e, sizeof(kvp_grant_extent_t));
        at[s->pend[k].desc] += sizeof(kvp_grant_extent_t);
    }
    free(at);
    bool ok = true;
    pos = 0;
    for (size_t i = 0; i < s->n && ok; i++) {
        if (s->set_n[i] == 0)
            continue;
        kvp_segment_t *seg = kvp_segment_table_get(&st->segments, s->descs[i].id);
        kvp_grant_set_hdr_t *h = (kvp_grant_set_hdr_t *)(s->sets + pos);
        *h = (kvp_grant_set_hdr_t){.version = KVP_GRANT_SET_VERSION,
                                   .op = s->set_op,
                                   .count = s->set_n[i],
                                   .segment_id = s->descs[i].id,
                                   .expiry_ms = st->grant_now_ms + s->set_ttl_ms,
                                   .epoch = st->grant_epoch,
                                   .nonce = ++st->grant_nonce,
                                   .principal = call->who->tag};
        ok = seg != NULL && seg->grant_mac != NULL &&
             kvp_grant_set_seal(seg->grant_mac, h, (const kvp_grant_extent_t *)(h + 1));
        s->descs[i].grant_set.data = (uint8_t *)h;
        s->descs[i].grant_set.len = kvp_grant_set_len(s->set_n[i]);
        pos += kvp_grant_set_len(s->set_n[i]);
    }
    return ok;
}

bool kvp_seg_set_finish(kvp_seg_set_t *s)
{
    s->ptrs = malloc((s->n ? s->n : 1) * sizeof(*s->ptrs));
    if (s->ptrs == NULL)
        return false;
    for (size_t i = 0; i < s->n; i++)
        s->ptrs[i] = &s->descs[i];
    return true;
}

/*
 * May `who` hold the whole of seg's memory (the shm hand-off; an rdma queue pair and the
 * rkey)? Only when the grants it could be given would cover every object the segment can
 * hold, so that it gets no byte tcp would refuse it: an admin; a reader and writer of every
 * key of its tenant on a segment dedicated to that tenant (or on any segment when there
 * are no tenants); for shm also a trusted local worker (role shm) on any segment. DRAM
 * segments only.
 */
static bool may_hold(const kvp_master_state_t *st, const kvp_principal_t *who,
                     const kvp_segment_t *seg, bool shm)
{
    if (strcmp(seg->medium, "dram") != 0)
        return false;
    if ((who->roles & KVP_ROLE_ADMIN) || (shm && (who->roles & KVP_ROLE_SHM)))
        return true;
    uint32_t rw = KVP_ROLE_READ | KVP_ROLE_WRITE;
    if ((who->roles & rw) != rw || who->n_patterns != 0)
        return false;
    return !st->tenants_on || (seg->dedicated && seg->tenant == who->tenant_id);
}

/* seg's K_p (and K_r when rdma) for the principal tag into out (64 bytes), from the
 * segment's one-principal cache when it is tag's. false: could not be derived. */
static bool seg_conn_keys(kvp_segment_t *seg, uint64_t tag, bool rdma, uint8_t *out)
{
    _Static_assert(sizeof(seg->keys.kp) == KVP_GRANT_KEY_LEN, "K_p is a grant key");
    if (!seg->keys.valid || seg->keys.tag != tag) {
        seg->keys.valid = seg->keys.rdma = seg->keys.map = false;
        if (!kvp_grant_conn_key(seg->grant_mac, tag, seg->keys.kp))
            return false;
        seg->keys.tag = tag;
        seg->keys.valid = true;
    }
    if (rdma && !seg->keys.rdma) {
        if (!kvp_grant_rdma_key(seg->grant_mac, tag, seg->keys.kr))
            return false;
        seg->keys.rdma = true;
    }
    memcpy(out, seg->keys.kp, KVP_GRANT_KEY_LEN);
    if (rdma)
        memcpy(out + KVP_GRANT_KEY_LEN, seg->keys.kr, KVP_GRANT_KEY_LEN);
    return true;
}

/* A MAP grant of seg for the principal tag (seg_conn_keys' first) into g: the one handed out
 * last while over half its life is left and the master's epoch is the same, else a new one.
 * false: could not be sealed. */
static bool seg_map_grant(kvp_master_state_t *st, kvp_segment_t *seg, uint64_t tag, uint64_t now,
                          kvp_grant_t *g)
{
    _Static_assert(sizeof(seg->keys.map_grant) == sizeof(*g), "a MAP grant is a grant");
    uint64_t ttl = st->config.put_timeout_ms;
    if (seg->keys.map) {
        memcpy(g, seg->keys.map_grant, sizeof(*g));
        if (g->principal == tag && g->epoch == st->grant_epoch && g->expiry_ms > now + ttl / 2)
            return true;
    }
    *g = (kvp_grant_t){.version = KVP_GRANT_VERSION,
                       .op = KVP_GRANT_MAP,
                       .segment_id = seg->id,
                       .offset = 0,
                       .length = seg->size,
                       .expiry_ms = now + ttl,
                       .epoch = st->grant_epoch,
                       .nonce = ++st->grant_nonce,
                       .principal = tag};
    if (!kvp_grant_seal(seg->grant_mac, g))
        return false;
    memcpy(seg->keys.map_grant, g, sizeof(*g));
    seg->keys.map = true;
    return true;
}

bool kvp_seg_set_conn_keys(kvp_call_t *call, kvp_seg_set_t *s)
{
    kvp_master_state_t *st = call->st;
    for (size_t i = 0; i < s->n; i++) {
        const kvp_segment_t *seg = kvp_segment_table_get(&st->segments, s->descs[i].id);
        if (seg != NULL)
            kvp_seg_desc_for_caller(call, seg, &s->descs[i]);
    }
    if (!st->grants_on || call->who == NULL || s->n == 0)
        return true;
    if (s->n_pend > 0 && !seal_sets(call, s))
        return false;
    s->conn_keys = malloc(s->n * 2 * KVP_GRANT_KEY_LEN); /* K_p, then K_r */
    s->shm_grants = malloc(s->n * sizeof(kvp_grant_t));
    if (s->conn_keys == NULL || s->shm_grants == NULL)
        return false;
    uint64_t now = kvp_grant_now_ms();
    for (size_t i = 0; i < s->n; i++) {
        Kvpool__SegmentDesc *d = &s->descs[i];
        kvp_segment_t *seg = kvp_segment_table_get(&st->segments, d->id);
        uint8_t *key = s->conn_keys + i * 2 * KVP_GRANT_KEY_LEN;
        if (seg == NULL || seg->grant_mac == NULL)
            continue;
        /* through memory windows (the owner binds one per granted extent on the caller's
         * queue pair) every principal the master hands grants for the segment may use
         * rdma; without, only one whose grants cover all the segment can hold */
        bool rdma = seg->rdma_endpoint[0] != '\0' &&
                    (seg->rdma_windows || may_hold(st, call->who, seg, false));
        if (!seg_conn_keys(seg, call->who->tag, rdma, key))
            return false;
        d->conn_key.data = key;
        d->conn_key.len = KVP_GRANT_KEY_LEN;
        d->conn_tag = call->who->tag;
        if (rdma) {
            d->rdma_key.data = key + KVP_GRANT_KEY_LEN;
            d->rdma_key.len = KVP_GRANT_KEY_LEN;
        }
        if (seg->shm_path[0] != '@' || !may_hold(st, call->who, seg, true))
            continue;
        /* used once, when the caller first attaches the segment (peer_table.c) */
        kvp_grant_t *g = &s->shm_grants[i];
        if (!seg_map_grant(st, seg, call->who->tag, now, g))
            return false;
        d->shm_grant.data = (uint8_t *)g;
        d->shm_grant.len = sizeof(*g);
    }
    return true;
}

void kvp_seg_set_free(kvp_seg_set_t *s)
{
    free(s->descs);
    free(s->ptrs);
    if (s->conn_keys != NULL)
        OPENSSL_cleanse(s->conn_keys, s->n * 2 * KVP_GRANT_KEY_LEN);
    free(s->conn_keys);
    free(s->shm_grants);
    free(s->pend);
    free(s->set_n);
    free(s->sets);
}

/*
 * Append obj's replicas to a response under construction: reps/repptr have
 * room (sized by the caller), *nr counts what is used, segs collects the
 * descriptors. false: out of memory.
 */
bool kvp_call_grants_reserve(kvp_master_state_t *st, size_t count)
{
    if (!st->grants_on)
        return true;
    if (count > st->grant_cap) {
        kvp_grant_t *g = realloc(st->grant_buf, count * sizeof(*g));
        if (g == NULL)
            return false;
        st->grant_buf = g;
        st->grant_cap = count;
    }
    st->grant_now_ms = kvp_grant_now_ms();
    return true;
}

bool kvp_call_grant(kvp_call_t *call, Kvpool__Replica *rep, size_t slot, uint8_t op,
                    uint64_t ttl_ms, uint64_t version)
{
    kvp_master_state_t *st = call->st;
    if (!st->grants_on || slot >= st->grant_cap)
        return true;
    kvp_segment_t *seg = kvp_segment_table_get(&st->segments, rep->segment_id);
    if (seg == NULL || seg->grant_mac == NULL)
        return true;
    kvp_grant_t *g = &st->grant_buf[slot];
    *g = (kvp_grant_t){.version = KVP_GRANT_VERSION,
                       .op = op,
                       .segment_id = rep->segment_id,
                       .offset = rep->offset,
                       .length = rep->length,
                       .expiry_ms = st->grant_now_ms + ttl_ms,
                       .epoch = st->grant_epoch,
                       .nonce = version ? version : ++st->grant_nonce,
                       .principal = call->who != NULL ? call->who->tag : 0};
    if (!kvp_grant_seal(seg->grant_mac, g))
        return false;
    rep->grant.data = (uint8_t *)g;
    rep->grant.len = sizeof(*g);
    return true;
}

/* Put rep's extent in descriptor d's grant set; rep names it. */
static bool set_put(kvp_seg_set_t *s, size_t d, Kvpool__Replica *rep, uint64_t version)
{
    if (s->n_pend == s->cap_pend) {
        size_t cap = s->cap_pend ? s->cap_pend * 2 : 64;
        struct kvp_set_ext *p = realloc(s->pend, cap * sizeof(*p));
        if (p == NULL)
            return false;
        s->pend = p;
        s->cap_pend = cap;
    }
    s->pend[s->n_pend++] = (struct kvp_set_ext){
        .desc = d, .e = {.offset = rep->offset, .length = rep->length, .version = version}};
    rep->grant_set = (uint32_t)d + 1;
    rep->grant_index = s->set_n[d]++;
    return true;
}

bool kvp_call_grant_extent(kvp_call_t *call, Kvpool__Replica *rep, size_t slot, kvp_seg_set_t *segs,
                           uint8_t op, uint64_t ttl_ms, uint64_t version)
{
    kvp_master_state_t *st = call->st;
    kvp_segment_t *seg = kvp_segment_table_get(&st->segments, rep->segment_id);
    size_t d = 0;
    if (seg == NULL)
        return true; /* (no descriptor, no grant: the caller cannot reach it) */
    if (!kvp_seg_set_add(segs, seg, &d))
        return false;
    if (st->grants_on && call->who != NULL && seg->grant_mac != NULL &&
        segs->set_n[d] < KVP_GRANT_SET_MAX) {
        if (!set_put(segs, d, rep, version))
            return false;
        segs->set_op = op;
        segs->set_ttl_ms = ttl_ms;
        return true;
    }
    return kvp_call_grant(call, rep, slot, op, ttl_ms, version);
}

bool kvp_call_add_replicas(kvp_call_t *call, const kvp_object_t *obj, Kvpool__Replica *reps,
                           Kvpool__Replica **repptr, size_t *nr, kvp_seg_set_t *segs,
                           uint8_t grant_op, uint64_t grant_ttl_ms)
{
    kvp_master_state_t *st = call->st;
    /* a COMPLETE object's readers get DRAM replicas first (a PENDING one's writer gets
     * them in place order: its PutEnd's written_mask refers to them by position) */
    unsigned order[KVP_MAX_REPLICAS], k = 0;
    bool tiers =
        obj->state == KVP_OBJ_COMPLETE && st->segments.capacity_ssd + st->segments.capacity_dfs > 0;
    for (int ssd = 0; ssd < 2; ssd++)
        for (unsigned r = 0; r < obj->n_replicas; r++)
            if (!tiers ? ssd == 0
                       : kvp_segment_table_replica_on(&st->segments, &obj->replicas[r], ssd) ||
                             (ssd == 1 && kvp_segment_table_get(
                                              &st->segments, obj->replicas[r].segment_id) == NULL))
                order[k++] = r;
    for (unsigned q = 0; q < k; q++) {
        unsigned r = order[q];
        Kvpool__Replica *rep = &reps[*nr];
        kvpool__replica__init(rep);
        rep->segment_id = obj->replicas[r].segment_id;
        rep->offset = obj->replicas[r].offset;
        rep->length = obj->size;
        /* a set's extents carry the object's version for reads too: an owner whose
         * record holds a later object at the extent refuses the read */
        if (!kvp_call_grant_extent(call, rep, *nr, segs, grant_op, grant_ttl_ms, obj->version))
            return false;
        repptr[(*nr)++] = rep;
    }
    return true;
}

kvp_status_t kvp_call_check_batch(size_t n_keys)
{
    return n_keys > 65536 ? KVP_ERR_TOO_MANY : KVP_OK;
}

/*
 * Validate a key off the wire and look it up. Keys travel as protobuf
 * `bytes` with an explicit length, so a NUL inside one is seen (and refused)
 * rather than silently shortening the key.
 */
kvp_status_t kvp_call_key_lookup(kvp_master_state_t *st, const ProtobufCBinaryData *key,
                                 kvp_object_t **obj_p, uint64_t *hash_p)
{
    const char *k = (const char *)key->data;
    size_t ulen = key->len;
    /* the key the user gave follows its tenant's prefix (dispatch.c), or without an ACL its
     * namespace's (client/control/key_scope.h): a key of 4096 bytes stays one */
    const char *user = kvp_tenant_user_key(k, key->len, &ulen);
    if (!kvp_key_valid(user, ulen))
        return KVP_ERR_BAD_KEY;
    uint64_t h = kvp_index_hash(k, key->len);
    if (hash_p)
        *hash_p = h;
    *obj_p = kvp_index_lookup(&st->index, k, key->len, h);
    return KVP_OK;
}
