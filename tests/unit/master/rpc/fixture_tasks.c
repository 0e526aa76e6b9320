/*
 * fixture_tasks.c - one-call helpers for copy and move tasks (see fixture_tasks.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "tests/unit/master/rpc/fixture_tasks.h"
#include "tests/unit/master/svc_call.h"

tid_t create(kvp_master_state_t *st, uint64_t conn, uint32_t kind, const char *key,
             const char *source, const char *const *targets, size_t n)
{
    return create_as(st, conn, NULL, kind, key, source, targets, n);
}

tid_t create_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who, uint32_t kind,
                const char *key, const char *source, const char *const *targets, size_t n)
{
    Kvpool__TaskCreateRequest req = KVPOOL__TASK_CREATE_REQUEST__INIT;
    req.kind = kind;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.source = (char *)(source ? source : "");
    req.targets = (char **)targets;
    req.n_targets = n;
    Kvpool__TaskCreateResponse *r = svc_call_as(st, conn, who, KVP_RPC_TASK_CREATE, &req.base,
                                                &kvpool__task_create_response__descriptor);
    assert_non_null(r);
    tid_t t = {.status = r->status, .hi = r->id_hi, .lo = r->id_lo};
    snprintf(t.msg, sizeof(t.msg), "%s", r->message);
    svc_msg_free(r);
    return t;
}

tq_t query(kvp_master_state_t *st, uint64_t conn, tid_t id)
{
    return query_as(st, conn, NULL, id);
}

tq_t query_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who, tid_t id)
{
    Kvpool__TaskQueryRequest req = KVPOOL__TASK_QUERY_REQUEST__INIT;
    req.id_hi = id.hi;
    req.id_lo = id.lo;
    Kvpool__TaskQueryResponse *r = svc_call_as(st, conn, who, KVP_RPC_TASK_QUERY, &req.base,
                                               &kvpool__task_query_response__descriptor);
    assert_non_null(r);
    tq_t q = {.status = r->status, .kind = r->kind, .task_status = r->task_status};
    snprintf(q.assigned, sizeof(q.assigned), "%s", r->assigned_client);
    snprintf(q.msg, sizeof(q.msg), "%s", r->message);
    svc_msg_free(r);
    return q;
}

kvp_principal_t tenant_principal(kvp_master_state_t *st, const char *name, const char *tenant)
{
    kvp_principal_t p = {.roles = KVP_ROLE_READ | KVP_ROLE_WRITE};
    snprintf(p.name, sizeof(p.name), "%s", name);
    snprintf(p.tenant, sizeof(p.tenant), "%s", tenant);
    int32_t id = kvp_tenant_id(&st->tenants, tenant, strlen(tenant), true);
    assert_true(id >= 0);
    p.tenant_id = (uint16_t)id;
    return p;
}

void put_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who, const char *key,
            const char *preferred, uint32_t crc)
{
    uint64_t size = SZ;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    cfg.replica_num = 1;
    cfg.preferred_segment = (char *)preferred;
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.sizes = &size;
    req.n_sizes = 1;
    req.config = &cfg;
    Kvpool__PutStartResponse *r = svc_call_as(st, conn, who, KVP_RPC_PUT_START, &req.base,
                                              &kvpool__put_start_response__descriptor);
    assert_non_null(r);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->results[0]->status, KVP_OK);
    svc_msg_free(r);
    Kvpool__PutEndRequest end_req = KVPOOL__PUT_END_REQUEST__INIT;
    end_req.keys = svc_keys(&key, 1);
    end_req.n_keys = 1;
    end_req.crc32c = &crc;
    end_req.n_crc32c = 1;
    Kvpool__StatusesResponse *e = svc_call_as(st, conn, who, KVP_RPC_PUT_END, &end_req.base,
                                              &kvpool__statuses_response__descriptor);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->statuses[0], KVP_OK);
    svc_msg_free(e);
}

/* The tasks a heartbeat of conn is offered: their count, the first one's id in *first. */
size_t offers(kvp_master_state_t *st, uint64_t conn, tid_t *first)
{
    Kvpool__HeartbeatRequest req = KVPOOL__HEARTBEAT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    Kvpool__HeartbeatResponse *r =
        svc_call(st, conn, KVP_RPC_HEARTBEAT, &req.base, &kvpool__heartbeat_response__descriptor);
    size_t n = r->n_tasks;
    if (n > 0 && first != NULL) {
        first->hi = r->tasks[0]->id_hi;
        first->lo = r->tasks[0]->id_lo;
    }
    svc_msg_free(r);
    return n;
}

/* A TaskStart of one task: the call's status when it failed whole, else the task's. */
started_t start(kvp_master_state_t *st, uint64_t conn, tid_t id)
{
    Kvpool__TaskOffer o = KVPOOL__TASK_OFFER__INIT, *op = &o;
    o.id_hi = id.hi;
    o.id_lo = id.lo;
    Kvpool__TaskStartRequest req = KVPOOL__TASK_START_REQUEST__INIT;
    req.tasks = &op;
    req.n_tasks = 1;
    Kvpool__TaskStartResponse *r =
        svc_call(st, conn, KVP_RPC_TASK_START, &req.base, &kvpool__task_start_response__descriptor);
    started_t s = {.status = r->status};
    if (r->status == KVP_OK) {
        assert_int_equal(r->n_results, 1);
        const Kvpool__TaskStartResult *x = r->results[0];
        s = (started_t){.status = x->status,
                        .size = x->size,
                        .crc = x->crc32c,
                        .source_seg = x->source_segment_id,
                        .source_off = x->source_offset,
                        .n = x->n_dests};
        assert_true(s.n <= 8);
        for (size_t i = 0; i < s.n; i++)
            s.d[i] = (rep_t){x->dests[i]->segment_id, x->dests[i]->offset, x->dests[i]->length};
    }
    svc_msg_free(r);
    return s;
}

/* A TaskEnd of one task: .status its refusal (negative) or 0, .task_status the task's after
 * it, .msg the task's message (TaskQuery). */
tq_t end(kvp_master_state_t *st, uint64_t conn, tid_t id, const int32_t *statuses, size_t n)
{
    Kvpool__TaskEndItem it = KVPOOL__TASK_END_ITEM__INIT, *itp = &it;
    it.id_hi = id.hi;
    it.id_lo = id.lo;
    it.statuses = (int32_t *)statuses;
    it.n_statuses = n;
    Kvpool__TaskEndRequest req = KVPOOL__TASK_END_REQUEST__INIT;
    req.tasks = &itp;
    req.n_tasks = 1;
    Kvpool__StatusesResponse *r =
        svc_call(st, conn, KVP_RPC_TASK_END, &req.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t v = r->statuses[0];
    svc_msg_free(r);
    tq_t q = {.status = v < 0 ? v : KVP_OK, .task_status = v < 0 ? 0u : (uint32_t)v};
    if (v >= 0)
        snprintf(q.msg, sizeof(q.msg), "%s", query(st, C3, id).msg);
    return q;
}
