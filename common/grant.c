/*
 * grant.c - sealing and checking data-plane grants (grant.h) with
 * HMAC-SHA256 (RFC 2104) over OpenSSL's SHA-256 (SHA-NI where the CPU has
 * it). The key's inner and outer states (SHA-256 of key ^ ipad, key ^ opad)
 * are computed once per context; a MAC copies them by value and adds the
 * message: three SHA-256 blocks for a 64-byte grant, no allocation. (OpenSSL
 * 3's EVP_MAC re-initialised with the same key duplicates its digest
 * contexts: two allocations per MAC, and about twice the time.) The
 * SHA256_* calls are deprecated in OpenSSL 3 in favour of EVP, which
 * allocates; they are what EVP runs underneath.
 */
#define OPENSSL_SUPPRESS_DEPRECATED
#include "common/grant.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

struct kvp_grant_mac {
    SHA256_CTX inner; /* after key ^ 0x36.. (one block) */
    SHA256_CTX outer; /* after key ^ 0x5c.. */
};

kvp_status_t kvp_grant_mac_create(const uint8_t *key, kvp_grant_mac_t **mac_p)
{
    kvp_grant_mac_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVP_ERR_NOMEM;
    uint8_t ipad[SHA256_CBLOCK], opad[SHA256_CBLOCK];
    memset(ipad, 0x36, sizeof(ipad));
    memset(opad, 0x5c, sizeof(opad));
    for (size_t i = 0; i < KVP_GRANT_KEY_LEN; i++) { /* a key shorter than a block */
        ipad[i] ^= key[i];
        opad[i] ^= key[i];
    }
    bool ok = SHA256_Init(&m->inner) == 1 && SHA256_Update(&m->inner, ipad, sizeof(ipad)) == 1 &&
              SHA256_Init(&m->outer) == 1 && SHA256_Update(&m->outer, opad, sizeof(opad)) == 1;
    OPENSSL_cleanse(ipad, sizeof(ipad));
    OPENSSL_cleanse(opad, sizeof(opad));
    if (!ok) {
        kvp_grant_mac_destroy(m);
        return KVP_ERR_INTERNAL;
    }
    *mac_p = m;
    return KVP_OK;
}

void kvp_grant_mac_destroy(kvp_grant_mac_t *m)
{
    if (m == NULL)
        return;
    OPENSSL_cleanse(m, sizeof(*m));
    free(m);
}

/* HMAC-SHA256(key, msg) into out (32 bytes). */
static bool hmac(const kvp_grant_mac_t *m, const void *msg, size_t len, uint8_t out[32])
{
    SHA256_CTX c = m->inner;
    uint8_t ih[SHA256_DIGEST_LENGTH];
    bool ok = SHA256_Update(&c, msg, len) == 1 && SHA256_Final(ih, &c) == 1;
    c = m->outer;
    ok = ok && SHA256_Update(&c, ih, sizeof(ih)) == 1 && SHA256_Final(out, &c) == 1;
    OPENSSL_cleanse(&c, sizeof(c));
    return ok;
}

static bool compute(kvp_grant_mac_t *m, const kvp_grant_t *g, uint8_t out[32])
{
    return hmac(m, g, offsetof(kvp_grant_t, mac), out);
}

/* A key of principal `tag` derived from the segment key: HMAC(segment key, label || tag),
 * the label 15 bytes and a NUL. */
static bool derive(kvp_grant_mac_t *m, const char label[16], uint64_t tag, uint8_t *out)
{
    uint8_t msg[24];
    memcpy(msg, label, 16);
    memcpy(msg + 16, &tag, sizeof(tag));
    return hmac(m, msg, sizeof(msg), out);
}

bool kvp_grant_conn_key(kvp_grant_mac_t *m, uint64_t tag, uint8_t out[KVP_GRANT_KEY_LEN])
{
    return derive(m, "kvpool conn key", tag, out);
}

bool kvp_grant_rdma_key(kvp_grant_mac_t *m, uint64_t tag, uint8_t out[KVP_GRANT_KEY_LEN])
{
    return derive(m, "kvpool rdma key", tag, out);
}

bool kvp_grant_qp_proof(const uint8_t *rdma_key, kvp_grant_qp_proof_t *p)
{
    uint8_t msg[16 + 32] = "kvpool rdma qp"; /* NUL-padded to 16, then the fields */
    memcpy(msg + 16, &p->segment_id, 8);
    memcpy(msg + 24, &p->tag, 8);
    memcpy(msg + 32, &p->time_ms, 8);
    memcpy(msg + 40, &p->nonce, 8);
    uint8_t full[32];
    size_t n = 0;
    if (EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, rdma_key, KVP_GRANT_KEY_LEN, msg, sizeof(msg),
                  full, sizeof(full), &n) == NULL ||
        n != sizeof(full))
        return false;
    memcpy(p->mac, full, sizeof(p->mac));
    return true;
}

bool kvp_grant_hello_proof(const uint8_t *conn_key, const uint8_t *challenge, uint64_t segment_id,
                           uint64_t tag, uint8_t out[KVP_GRANT_PROOF_LEN])
{
    uint8_t msg[16 + KVP_GRANT_CHALLENGE_LEN + 16] = "kvpool hello"; /* NUL-padded to 16 */
    memcpy(msg + 16, challenge, KVP_GRANT_CHALLENGE_LEN);
    memcpy(msg + 16 + KVP_GRANT_CHALLENGE_LEN, &segment_id, 8);
    memcpy(msg + 24 + KVP_GRANT_CHALLENGE_LEN, &tag, 8);
    size_t n = 0;
    return EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, conn_key, KVP_GRANT_KEY_LEN, msg,
                     sizeof(msg), out, KVP_GRANT_PROOF_LEN, &n) != NULL &&
           n == KVP_GRANT_PROOF_LEN;
}

bool kvp_grant_seal(kvp_grant_mac_t *m, kvp_grant_t *g)
{
    uint8_t full[32];
    if (!compute(m, g, full))
        return false;
    memcpy(g->mac, full, KVP_GRANT_MAC_LEN);
    return true;
}

/* The checks a grant and a set share after their MAC: NULL, or which one failed. */
static const char *fields_why(uint8_t version, uint8_t want_version, uint8_t g_op, uint8_t op,
                              uint64_t g_segment, uint64_t segment, uint64_t g_epoch,
                              uint64_t epoch)
{
    if (version != want_version)
        return "unknown grant version";
    if (g_op != op)
        return op == KVP_GRANT_WRITE ? "a read grant used to write" : "a write grant used to read";
    if (g_segment != segment)
        return "a grant for another segment";
    if (g_epoch != epoch)
        return "a grant from another epoch of the master";
    return NULL;
}

bool kvp_grant_set_seal(kvp_grant_mac_t *m, kvp_grant_set_hdr_t *h, const kvp_grant_extent_t *ext)
{
    SHA256_CTX c = m->inner;
    uint8_t ih[SHA256_DIGEST_LENGTH], full[SHA256_DIGEST_LENGTH];
    bool ok = SHA256_Update(&c, h, offsetof(kvp_grant_set_hdr_t, mac)) == 1 &&
              SHA256_Update(&c, ext, (size_t)h->count * sizeof(*ext)) == 1 &&
              SHA256_Final(ih, &c) == 1;
    c = m->outer;
    ok = ok && SHA256_Update(&c, ih, sizeof(ih)) == 1 && SHA256_Final(full, &c) == 1;
    OPENSSL_cleanse(&c, sizeof(c));
    if (ok)
        memcpy(h->mac, full, KVP_GRANT_MAC_LEN);
    return ok;
}

kvp_status_t kvp_grant_set_check(kvp_grant_mac_t *m, const kvp_grant_set_hdr_t *h,
                                 const kvp_grant_extent_t *ext, uint8_t op, uint64_t segment_id,
                                 uint64_t epoch, uint64_t now_ms, const char **why_p)
{
    kvp_grant_set_hdr_t want = *h;
    const char *why = NULL;
    if (h->count == 0 || h->count > KVP_GRANT_SET_MAX) /* before hashing count extents */
        why = "a grant set of no extents or too many";
    else if (!kvp_grant_set_seal(m, &want, ext) ||
             CRYPTO_memcmp(want.mac, h->mac, KVP_GRANT_MAC_LEN) != 0)
        why = "its MAC does not match (not sealed by this segment's master)";
    else if ((why = fields_why(h->version, KVP_GRANT_SET_VERSION, h->op, op, h->segment_id,
                               segment_id, h->epoch, epoch)) != NULL)
        ;
    else if (now_ms > h->expiry_ms + KVP_GRANT_SKEW_MS)
        why = "the grant has expired";
    if (why_p != NULL)
        *why_p = why;
    return why == NULL ? KVP_OK : KVP_ERR_DENIED;
}

bool kvp_grant_extent_covers(const kvp_grant_extent_t *e, uint64_t offset, uint64_t length)
{
    uint64_t end, e_end;
    return length != 0 && !__builtin_add_overflow(offset, length, &end) &&
           !__builtin_add_overflow(e->offset, e->length, &e_end) && offset >= e->offset &&
           end <= e_end;
}

kvp_status_t kvp_grant_check(kvp_grant_mac_t *m, const kvp_grant_t *g, uint8_t op,
                             uint64_t segment_id, uint64_t offset, uint64_t length, uint64_t epoch,
                             uint64_t now_ms, const char **why_p)
{
    uint8_t full[32];
    const char *why = NULL;
    if (!compute(m, g, full) || CRYPTO_memcmp(full, g->mac, KVP_GRANT_MAC_LEN) != 0)
        why = "its MAC does not match (not sealed by this segment's master)";
    else if ((why = fields_why(g->version, KVP_GRANT_VERSION, g->op, op, g->segment_id, segment_id,
                               g->epoch, epoch)) != NULL)
        ;
    else if (!kvp_grant_extent_covers(&(kvp_grant_extent_t){g->offset, g->length, 0}, offset,
                                      length))
        why = "the request reaches outside the grant's extent";
    else if (now_ms > g->expiry_ms + KVP_GRANT_SKEW_MS)
        why = "the grant has expired";
    if (why_p != NULL)
        *why_p = why;
    return why == NULL ? KVP_OK : KVP_ERR_DENIED;
}

uint64_t kvp_grant_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

bool kvp_grant_mount_proof(const uint8_t secret[KVP_PROVE_SECRET_LEN],
                           const uint8_t nonce[KVP_PROVE_NONCE_LEN], const char *name,
                           uint8_t out[KVP_PROVE_LEN])
{
    size_t name_len = strnlen(name, KVP_PROVE_NAME_MAX + 1);
    if (name_len > KVP_PROVE_NAME_MAX)
        return false;
    uint8_t msg[16 + KVP_PROVE_NONCE_LEN + KVP_PROVE_NAME_MAX] = "kvpool prove"; /* NUL-padded */
    memcpy(msg + 16, nonce, KVP_PROVE_NONCE_LEN);
    memcpy(msg + 16 + KVP_PROVE_NONCE_LEN, name, name_len);
    size_t n = 0;
    return EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, secret, KVP_PROVE_SECRET_LEN, msg,
                     16 + KVP_PROVE_NONCE_LEN + name_len, out, KVP_PROVE_LEN, &n) != NULL &&
           n == KVP_PROVE_LEN;
}

bool kvp_grant_equal(const void *a, const void *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}

bool kvp_grant_random(void *buf, size_t len)
{
    return RAND_bytes(buf, (int)len) == 1;
}

void kvp_grant_keyring_init(kvp_grant_keyring_t *kr)
{
    memset(kr, 0, sizeof(*kr));
    pthread_mutex_init(&kr->lock, NULL);
}

void kvp_grant_keyring_cleanup(kvp_grant_keyring_t *kr)
{
    OPENSSL_cleanse(kr->key, sizeof(kr->key));
    pthread_mutex_destroy(&kr->lock);
}

void kvp_grant_keyring_set(kvp_grant_keyring_t *kr, const uint8_t *key, size_t key_len,
                           uint64_t epoch)
{
    pthread_mutex_lock(&kr->lock);
    kr->on = key != NULL && key_len == KVP_GRANT_KEY_LEN;
    if (kr->on)
        memcpy(kr->key, key, KVP_GRANT_KEY_LEN);
    else
        OPENSSL_cleanse(kr->key, sizeof(kr->key));
    kr->epoch = epoch;
    atomic_fetch_add(&kr->gen, 1);
    pthread_mutex_unlock(&kr->lock);
}

bool kvp_grant_verifier_sync(kvp_grant_verifier_t *v, kvp_grant_keyring_t *kr)
{
    if (atomic_load_explicit(&kr->gen, memory_order_acquire) == v->gen)
        return true;
    pthread_mutex_lock(&kr->lock);
    uint8_t key[KVP_GRANT_KEY_LEN];
    bool on = kr->on;
    uint64_t epoch = kr->epoch, gen = atomic_load(&kr->gen);
    memcpy(key, kr->key, sizeof(key));
    pthread_mutex_unlock(&kr->lock);
    kvp_grant_mac_destroy(v->mac);
    v->mac = NULL;
    v->on = false;
    v->set_ok = false; /* a set checked under the old key is not taken again */
    bool ok = !on || kvp_grant_mac_create(key, &v->mac) == KVP_OK;
    OPENSSL_cleanse(key, sizeof(key));
    if (!ok)
        return false; /* gen not taken: tried again on the next request, refused meanwhile */
    v->on = on;
    v->epoch = epoch;
    v->gen = gen;
    return true;
}

void kvp_grant_verifier_cleanup(kvp_grant_verifier_t *v)
{
    kvp_grant_mac_destroy(v->mac);
    free(v->set_ext);
    memset(v, 0, sizeof(*v));
}
