/*
 * admin.c - key listing, bulk remove (by regex, all), and draining segments
 * (this client's own, or asking another owner to drain its).
 *
 * Thread: any client thread; master traffic through the session.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/api.h"
#include "client/client_priv.h"
#include "client/control/drain.h"
#include "client/control/task.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/macros.h"

/* ---------------- list / bulk remove ---------------- */

static kvp_status_t list_keys_impl(kvp_client_t *c, const char *pattern, size_t max,
                                   kvp_key_info_t **keys_p, size_t *n_p)
{
    if (c == NULL || keys_p == NULL || n_p == NULL)
        return KVP_ERR_INVALID_ARG;
    *keys_p = NULL;
    *n_p = 0;
    kvp_key_info_t *out = NULL;
    size_t n = 0, cap = 0;
    uint64_t cursor = 0;
    kvp_status_t st = KVP_OK;
    while (n < max) {
        Kvpool__ListRequest req = KVPOOL__LIST_REQUEST__INIT;
        req.pattern = pattern ? (char *)pattern : "";
        req.cursor = cursor;
        req.limit = (uint32_t)KVP_MIN(max - n, (size_t)1000);
        Kvpool__ListResponse *lr = kvp_session_call_unpack(c->session, KVP_RPC_LIST, &req.base,
                                                           &kvpool__list_response__descriptor, &st);
        if (lr == NULL)
            break;
        if (lr->status != KVP_OK) {
            st = lr->status;
            KVP_LOG_WARN("list: %s", lr->message);
            kvp_api_fail("list: %s", lr->message);
            kvpool__list_response__free_unpacked(lr, NULL);
            break;
        }
        for (size_t i = 0; i < lr->n_entries && n < max; i++) {
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 64;
                kvp_key_info_t *p = realloc(out, ncap * sizeof(*p));
                if (p == NULL) {
                    st = KVP_ERR_NOMEM;
                    break;
                }
                out = p;
                cap = ncap;
            }
            const Kvpool__ListEntry *e = lr->entries[i];
            kvp_key_info_t *k = &out[n];
            memset(k, 0, sizeof(*k));
            /* the key, then its tenant's name (kvp_key_info_tenant), in one allocation */
            size_t tl = e->tenant != NULL ? strlen(e->tenant) : 0;
            k->key = malloc(e->key.len + tl + 2);
            if (k->key == NULL) {
                st = KVP_ERR_NOMEM;
                break;
            }
            memcpy(k->key, e->key.data, e->key.len);
            k->key[e->key.len] = '\0';
            memcpy(k->key + e->key.len + 1, tl ? e->tenant : "", tl + 1);
            k->size = e->size;
            k->complete = e->state == 2;
            k->n_replicas = (uint32_t)KVP_MIN(e->n_replicas, (size_t)8);
            for (uint32_t r = 0; r < k->n_replicas; r++)
                k->segment_ids[r] = e->replicas[r]->segment_id;
            k->lease_ms = e->lease_ms;
            k->pin = e->pin;
            n++;
        }
        cursor = lr->next_cursor;
        kvpool__list_response__free_unpacked(lr, NULL);
        if (st != KVP_OK || cursor == 0)
            break;
    }
    if (st != KVP_OK) {
        kvp_key_list_free(out, n);
        return st;
    }
    *keys_p = out;
    *n_p = n;
    return KVP_OK;
}

kvp_status_t kvp_list_keys(kvp_client_t *c, const char *pattern, size_t max,
                           kvp_key_info_t **keys_p, size_t *n_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(list_keys_impl(c, pattern, max, keys_p, n_p), "list");
}

const char *kvp_key_info_tenant(const kvp_key_info_t *info)
{
    return info == NULL || info->key == NULL ? "" : info->key + strlen(info->key) + 1;
}

void kvp_key_list_free(kvp_key_info_t *keys, size_t n)
{
    for (size_t i = 0; keys != NULL && i < n; i++)
        free(keys[i].key);
    free(keys);
}

/* One RemoveByRegex call; *next_p: the cursor to go on from (0: done). */
static kvp_status_t remove_page(kvp_client_t *c, Kvpool__RemoveByRegexRequest *req,
                                uint64_t *removed_p, uint64_t *next_p)
{
    kvp_status_t st;
    Kvpool__RemoveByRegexResponse *rr =
        kvp_session_call_unpack(c->session, KVP_RPC_REMOVE_BY_REGEX, &req->base,
                                &kvpool__remove_by_regex_response__descriptor, &st);
    *next_p = 0;
    if (rr == NULL)
        return st;
    st = rr->status;
    if (st != KVP_OK) {
        KVP_LOG_WARN("remove by regex: %s", rr->message);
        kvp_api_fail("remove by regex: %s", rr->message);
    }
    *removed_p += rr->removed;
    *next_p = st == KVP_OK ? rr->next_cursor : 0;
    kvpool__remove_by_regex_response__free_unpacked(rr, NULL);
    return st;
}

/* A pattern's removal goes page by page (the master does a bounded page of matching work
 * per call, so no caller holds its loop up); *removed_p counts every page's, also when a
 * later page fails. */
static kvp_status_t remove_regex(kvp_client_t *c, const char *pattern, bool all, int force,
                                 uint64_t *removed_p)
{
    uint64_t removed = 0, next = 0;
    if (removed_p)
        *removed_p = 0;
    if (c == NULL || (!all && (pattern == NULL || pattern[0] == '\0')))
        return KVP_ERR_INVALID_ARG;
    Kvpool__RemoveByRegexRequest req = KVPOOL__REMOVE_BY_REGEX_REQUEST__INIT;
    req.pattern = all ? "" : (char *)pattern;
    req.all = all;
    req.force = force != 0;
    req.paged = !all;
    kvp_status_t st;
    do {
        req.cursor = next;
        st = remove_page(c, &req, &removed, &next);
    } while (st == KVP_OK && next != 0);
    if (removed_p)
        *removed_p = removed;
    return st;
}

static kvp_status_t remove_by_regex_impl(kvp_client_t *c, const char *pattern, int force,
                                         uint64_t *removed_p)
{
    return remove_regex(c, pattern, false, force, removed_p);
}

kvp_status_t kvp_remove_by_regex(kvp_client_t *c, const char *pattern, int force,
                                 uint64_t *removed_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(remove_by_regex_impl(c, pattern, force, removed_p),
                                       "remove_by_regex");
}

static kvp_status_t remove_all_impl(kvp_client_t *c, int force, uint64_t *removed_p)
{
    return remove_regex(c, NULL, true, force, removed_p);
}

kvp_status_t kvp_remove_all(kvp_client_t *c, int force, uint64_t *removed_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(remove_all_impl(c, force, removed_p), "remove_all");
}

/* ---------------- drain ---------------- */

kvp_status_t kvp_drain(kvp_client_t *c, uint32_t timeout_ms, uint64_t *moved_p, uint64_t *lost_p)
{
    kvp_api_enter();
    kvp_status_t st = KVP_ERR_INVALID_ARG;
    if (c != NULL) {
        kvp_drain_params_t p = kvp_client_drain_params(c);
        st = kvp_drain_run(&p, timeout_ms, moved_p, lost_p);
    } else {
        if (moved_p)
            *moved_p = 0;
        if (lost_p)
            *lost_p = 0;
    }
    return (kvp_status_t)kvp_api_leave(st, "drain");
}

kvp_status_t kvp_request_drain(kvp_client_t *c, const char *segment_name)
{
    kvp_api_enter();
    kvp_status_t st = c == NULL ? KVP_ERR_INVALID_ARG : kvp_drain_request(c->session, segment_name);
    return (kvp_status_t)kvp_api_leave(st, "request_drain");
}

kvp_status_t kvp_create_copy_task(kvp_client_t *c, const char *key, const char *const *targets,
                                  size_t n_targets, kvp_task_id_t *id_p)
{
    kvp_api_enter();
    kvp_status_t st = c == NULL || n_targets == 0 ? KVP_ERR_INVALID_ARG
                                                  : kvp_task_create(c->session, KVP_COPY_TASK, key,
                                                                    NULL, targets, n_targets, id_p);
    return (kvp_status_t)kvp_api_leave(st, "create_copy_task");
}

kvp_status_t kvp_create_move_task(kvp_client_t *c, const char *key, const char *source,
                                  const char *target, kvp_task_id_t *id_p)
{
    kvp_api_enter();
    const char *t[1] = {target};
    kvp_status_t st = c == NULL || target == NULL
                          ? KVP_ERR_INVALID_ARG
                          : kvp_task_create(c->session, KVP_MOVE_TASK, key, source, t, 1, id_p);
    return (kvp_status_t)kvp_api_leave(st, "create_move_task");
}

kvp_status_t kvp_query_task(kvp_client_t *c, kvp_task_id_t id, kvp_task_info_t *info)
{
    kvp_api_enter();
    kvp_status_t st = c == NULL ? KVP_ERR_INVALID_ARG : kvp_task_query(c->session, id, info);
    return (kvp_status_t)kvp_api_leave(st, "query_task");
}

int kvp_client_segment_mounted(kvp_client_t *c)
{
    int s = c ? kvp_segment_state(c->seg) : KVP_SEG_NONE;
    return s == KVP_SEG_MOUNTED || s == KVP_SEG_DRAINING;
}
