/*
 * client_admin.c - the Client's admin calls: stat(), metrics(), metrics_text()
 * and list_keys(), and the dicts they build from libkvpool's result structs.
 *
 * Results are raw like the rest of the Client's (a negative status is
 * returned, not raised); the library call runs with the GIL released.
 *
 * Thread: the calling Python thread.
 */
#include <stddef.h>
#include <string.h>

#include "kvpool_py.h"

static int dict_set_u64(PyObject *d, const char *k, uint64_t v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    if (o == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, k, o);
    Py_DECREF(o);
    return rc;
}

static int dict_set_str(PyObject *d, const char *k, const char *v)
{
    PyObject *o = PyUnicode_DecodeUTF8(v, (Py_ssize_t)strlen(v), "replace");
    if (o == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, k, o);
    Py_DECREF(o);
    return rc;
}

/* The uint64_t counters of kvp_pool_stat_t, by name. */
#define STAT_FIELD(f)                                                                              \
    {                                                                                              \
#f, offsetof(kvp_pool_stat_t, f)                                                           \
    }
static const struct {
    const char *name;
    size_t off;
} stat_fields[] = {
    STAT_FIELD(capacity),          STAT_FIELD(used),
    STAT_FIELD(objects),           STAT_FIELD(pending),
    STAT_FIELD(evicted_objects),   STAT_FIELD(evicted_bytes),
    STAT_FIELD(put_timeouts),      STAT_FIELD(moved_objects),
    STAT_FIELD(reading_objects),   STAT_FIELD(reading_bytes),
    STAT_FIELD(leases_released),   STAT_FIELD(leases_expired),
    STAT_FIELD(ssd_capacity),      STAT_FIELD(ssd_used),
    STAT_FIELD(offloaded_objects), STAT_FIELD(offload_dropped),
    STAT_FIELD(offload_failed),    STAT_FIELD(offloading_objects),
    STAT_FIELD(promoted_objects),  STAT_FIELD(hits_dram),
    STAT_FIELD(hits_ssd),          STAT_FIELD(ssd_evicted_objects),
    STAT_FIELD(adopted_objects),   STAT_FIELD(ssd_lost_objects),
    STAT_FIELD(adopt_refused),     STAT_FIELD(epoch),
    STAT_FIELD(taken_back),        STAT_FIELD(limbo_expired),
};
#undef STAT_FIELD

static PyObject *stat_dict(const kvp_pool_stat_t *s)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
        uint64_t v;
        memcpy(&v, (const char *)s + stat_fields[i].off, sizeof(v));
        if (dict_set_u64(d, stat_fields[i].name, v) != 0)
            goto err;
    }
    if (dict_set_str(d, "leader", s->leader) != 0 || dict_set_str(d, "standbys", s->standbys) != 0)
        goto err;
    PyObject *segs = PyList_New((Py_ssize_t)s->n_segments);
    if (segs == NULL)
        goto err;
    if (PyDict_SetItemString(d, "segments", segs) != 0) {
        Py_DECREF(segs);
        goto err;
    }
    Py_DECREF(segs); /* d holds it */
    for (size_t i = 0; i < s->n_segments; i++) {
        const kvp_segment_info_t *g = &s->segments[i];
        PyObject *sd = PyDict_New();
        if (sd == NULL)
            goto err;
        PyList_SET_ITEM(segs, (Py_ssize_t)i, sd);
        if (dict_set_u64(sd, "id", g->id) != 0 || dict_set_str(sd, "name", g->name) != 0 ||
            dict_set_str(sd, "medium", g->medium) != 0 ||
            dict_set_str(sd, "endpoint", g->endpoint) != 0 ||
            dict_set_u64(sd, "size", g->size) != 0 || dict_set_u64(sd, "used", g->used) != 0 ||
            dict_set_u64(sd, "objects", g->objects) != 0 ||
            PyDict_SetItemString(sd, "draining", g->draining ? Py_True : Py_False) != 0)
            goto err;
    }
    return d;
err:
    Py_DECREF(d);
    return NULL;
}

/* stat() -> dict, or a negative status */
PyObject *kvp_py_client_stat(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    kvp_client_t *c;
    kvp_pool_stat_t *s = NULL;
    kvp_status_t st = KVP_OK;
    PyObject *ret;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_pool_stat(c, &s));
    if (kvp_py_call_failed(self, c, st, &ret))
        return ret;
    PyObject *d = stat_dict(s);
    kvp_pool_stat_free(s);
    return d;
}

/* {"ops": n, "bytes": n} into d[key]; -1 on a Python error. */
static int dict_set_count(PyObject *d, const char *key, const kvp_metrics_count_t *c)
{
    PyObject *o = Py_BuildValue("{s:K,s:K}", "ops", (unsigned long long)c->ops, "bytes",
                                (unsigned long long)c->bytes);
    if (o == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, o);
    Py_DECREF(o);
    return rc;
}

/* {"put": {ops, bytes}, "get": {ops, bytes}} into d[name]. */
static int dict_set_dirs(PyObject *d, const char *name, const kvp_metrics_count_t *put,
                         const kvp_metrics_count_t *get)
{
    PyObject *o = PyDict_New();
    if (o == NULL)
        return -1;
    int rc = dict_set_count(o, "put", put) != 0 || dict_set_count(o, "get", get) != 0
                 ? -1
                 : PyDict_SetItemString(d, name, o);
    Py_DECREF(o);
    return rc;
}

/* A new empty dict set as d[name] (borrowed back), or NULL. */
static PyObject *dict_sub(PyObject *d, const char *name)
{
    PyObject *o = PyDict_New();
    if (o == NULL)
        return NULL;
    int rc = PyDict_SetItemString(d, name, o);
    Py_DECREF(o);
    return rc == 0 ? o : NULL;
}

/* d["master_rpc"] = {method: {calls, failed, wait_s}} (every method the library names) and
 * d["transfer"] = {"put": {batches, seconds}, "get": ...}: where a batch's time goes. */
static int dict_set_waits(PyObject *d, const kvp_metrics_t *m)
{
    PyObject *rpc = dict_sub(d, "master_rpc"), *xf = dict_sub(d, "transfer");
    if (rpc == NULL || xf == NULL)
        return -1;
    for (unsigned i = 0; i < KVP_METRICS_RPC_MAX; i++) {
        const char *name = kvp_metrics_rpc_name(i);
        if (name == NULL)
            continue;
        const kvp_metrics_rpc_t *r = &m->master_rpc[i];
        PyObject *o =
            Py_BuildValue("{s:K,s:K,s:d}", "calls", (unsigned long long)r->calls, "failed",
                          (unsigned long long)r->failed, "wait_s", (double)r->wait_ns / 1e9);
        int rc = o == NULL ? -1 : PyDict_SetItemString(rpc, name, o);
        Py_XDECREF(o);
        if (rc != 0)
            return -1;
    }
    static const char *const dirs[2] = {"put", "get"};
    for (int d2 = 0; d2 < 2; d2++) {
        PyObject *o =
            Py_BuildValue("{s:K,s:d}", "batches", (unsigned long long)m->transfer_runs[d2],
                          "seconds", (double)m->transfer_ns[d2] / 1e9);
        int rc = o == NULL ? -1 : PyDict_SetItemString(xf, dirs[d2], o);
        Py_XDECREF(o);
        if (rc != 0)
            return -1;
    }
    return 0;
}

static PyObject *metrics_dict(const kvp_metrics_t *m)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    PyObject *cl, *sv, *er, *sg, *io, *segs;
    if (dict_set_u64(d, "version", m->version) != 0 || (cl = dict_sub(d, "client")) == NULL ||
        (sv = dict_sub(d, "served")) == NULL || (er = dict_sub(d, "errors")) == NULL ||
        (sg = dict_sub(d, "staged")) == NULL || (io = dict_sub(d, "ssd_io")) == NULL)
        goto err;
    for (unsigned t = 0; t < KVP_METRICS_TP_COUNT; t++)
        if (dict_set_dirs(cl, kvp_metrics_transport_name(t), &m->client[t].put,
                          &m->client[t].get) != 0)
            goto err;
    /* only the data servers see requests: tcp (the DRAM segment) and ssd */
    if (dict_set_dirs(sv, "tcp", &m->served[KVP_METRICS_TP_TCP].put,
                      &m->served[KVP_METRICS_TP_TCP].get) != 0 ||
        dict_set_dirs(sv, "ssd", &m->served[KVP_METRICS_TP_SSD].put,
                      &m->served[KVP_METRICS_TP_SSD].get) != 0 ||
        dict_set_u64(er, "put", m->put_errors) != 0 ||
        dict_set_u64(er, "get", m->get_errors) != 0 ||
        dict_set_count(sg, "host", &m->staged[0]) != 0 ||
        dict_set_count(sg, "gpu", &m->staged[1]) != 0 ||
        dict_set_count(io, "read", &m->ssd_read) != 0 ||
        dict_set_count(io, "write", &m->ssd_write) != 0 ||
        dict_set_u64(io, "errors", m->ssd_io_errors) != 0 ||
        dict_set_u64(d, "refused_protected", m->refused_protected) != 0 ||
        dict_set_u64(d, "refused_grant", m->refused_grant) != 0 ||
        dict_set_u64(d, "refused_shm", m->refused_shm) != 0 ||
        dict_set_u64(d, "refused_rdma", m->refused_rdma) != 0 ||
        dict_set_u64(d, "rdma_access_errors", m->rdma_access_errors) != 0 ||
        dict_set_waits(d, m) != 0)
        goto err;
    segs = PyList_New(0);
    if (segs == NULL)
        goto err;
    int rc = PyDict_SetItemString(d, "segments", segs);
    Py_DECREF(segs);
    if (rc != 0)
        goto err;
    for (int tier = 0; tier < 2; tier++) {
        const char *name = tier == 0 ? m->dram_segment : m->ssd_segment;
        if (name[0] == '\0')
            continue;
        PyObject *sd = Py_BuildValue(
            "{s:s,s:s,s:K,s:O,s:O}", "name", name, "tier", tier == 0 ? "dram" : "ssd", "capacity",
            (unsigned long long)(tier == 0 ? m->dram_capacity : m->ssd_capacity), "mounted",
            (tier == 0 ? m->dram_mounted : m->ssd_mounted) ? Py_True : Py_False, "draining",
            tier == 0 && m->dram_draining ? Py_True : Py_False);
        if (sd == NULL)
            goto err;
        rc = PyList_Append(segs, sd);
        Py_DECREF(sd);
        if (rc != 0)
            goto err;
    }
    return d;
err:
    Py_DECREF(d);
    return NULL;
}

/* kvp_metrics_snapshot into *m: 0, or -1 with *ret_p the method's result (a
 * negative status, or NULL with the closed error raised). */
static int snapshot(kvp_py_client_t *self, kvp_metrics_t *m, PyObject **ret_p)
{
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_metrics_snapshot(c, m));
    return kvp_py_call_failed(self, c, st, ret_p) ? -1 : 0;
}

/* metrics() -> dict, or a negative status */
PyObject *kvp_py_client_metrics(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    kvp_metrics_t m = {.size = sizeof(m)};
    PyObject *ret;
    if (snapshot(self, &m, &ret) != 0)
        return ret;
    return metrics_dict(&m);
}

/* metrics_text() -> str (Prometheus text exposition), or a negative status */
PyObject *kvp_py_client_metrics_text(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    kvp_metrics_t m = {.size = sizeof(m)};
    PyObject *ret;
    if (snapshot(self, &m, &ret) != 0)
        return ret;
    size_t need = kvp_metrics_format_prometheus(&m, NULL, 0);
    char *buf = PyMem_Malloc(need + 1);
    if (buf == NULL)
        return PyErr_NoMemory();
    kvp_metrics_format_prometheus(&m, buf, need + 1);
    PyObject *r = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)need, "replace");
    PyMem_Free(buf);
    return r;
}

/* list_keys(pattern=None, max=1000) -> [dict], or a negative status */
PyObject *kvp_py_client_list_keys(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"pattern", "max", NULL};
    const char *pattern = NULL;
    Py_ssize_t max = 1000;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zn:list_keys", kwlist, &pattern, &max))
        return NULL;
    if (max < 0) {
        PyErr_SetString(PyExc_ValueError, "max must be >= 0");
        return NULL;
    }
    kvp_client_t *c;
    kvp_key_info_t *keys = NULL;
    size_t n = 0;
    kvp_status_t st = KVP_OK;
    PyObject *ret;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_list_keys(c, pattern, (size_t)max, &keys, &n));
    if (kvp_py_call_failed(self, c, st, &ret))
        return ret;
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *d = Py_BuildValue("{s:s,s:K,s:O,s:I,s:I,s:I,s:s}", "key", keys[i].key, "size",
                                    (unsigned long long)keys[i].size, "complete",
                                    keys[i].complete ? Py_True : Py_False, "replicas",
                                    keys[i].n_replicas, "lease_ms", keys[i].lease_ms, "pin",
                                    keys[i].pin, "tenant", kvp_key_info_tenant(&keys[i]));
        if (d == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
        /* The segments of its replicas (stat()'s segment ids): which medium each is on. */
        uint32_t nr = keys[i].n_replicas < 8 ? keys[i].n_replicas : 8;
        PyObject *ids = PyList_New((Py_ssize_t)nr);
        for (uint32_t r = 0; ids != NULL && r < nr; r++) {
            PyObject *id = PyLong_FromUnsignedLongLong(keys[i].segment_ids[r]);
            if (id == NULL) {
                Py_CLEAR(ids);
                break;
            }
            PyList_SET_ITEM(ids, (Py_ssize_t)r, id);
        }
        int rc = ids == NULL ? -1 : PyDict_SetItemString(d, "segment_ids", ids);
        Py_XDECREF(ids);
        if (rc != 0) {
            Py_CLEAR(list);
            break;
        }
    }
    kvp_key_list_free(keys, n);
    return list;
}

/* The (hi, lo) of a task id as Mooncake's binding gives it: a pair of ints. */
static PyObject *task_id_tuple(kvp_task_id_t id)
{
    return Py_BuildValue("(KK)", (unsigned long long)id.hi, (unsigned long long)id.lo);
}

/* create_copy_task(key, targets) -> (hi, lo), or a negative status */
PyObject *kvp_py_client_create_copy_task(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "targets", NULL};
    const char *key;
    PyObject *targets;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO:create_copy_task", kwlist, &key, &targets))
        return NULL;
    PyObject *seq = PySequence_Fast(targets, "targets must be a sequence of str");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > 64) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "at most 64 targets");
        return NULL;
    }
    const char *names[64];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        names[i] = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
        if (names[i] == NULL) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "targets must be str");
            return NULL;
        }
    }
    kvp_client_t *c;
    kvp_task_id_t id = {0, 0};
    kvp_status_t st = KVP_OK;
    PyObject *ret;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_create_copy_task(c, key, names, (size_t)n, &id));
    Py_DECREF(seq);
    if (kvp_py_call_failed(self, c, st, &ret))
        return ret;
    return task_id_tuple(id);
}

/* create_move_task(key, source, target) -> (hi, lo), or a negative status */
PyObject *kvp_py_client_create_move_task(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "source", "target", NULL};
    const char *key, *source, *target;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sss:create_move_task", kwlist, &key, &source,
                                     &target))
        return NULL;
    kvp_client_t *c;
    kvp_task_id_t id = {0, 0};
    kvp_status_t st = KVP_OK;
    PyObject *ret;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_create_move_task(c, key, source, target, &id));
    if (kvp_py_call_failed(self, c, st, &ret))
        return ret;
    return task_id_tuple(id);
}

/* query_task((hi, lo)) -> dict, or a negative status */
PyObject *kvp_py_client_query_task(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"task_id", NULL};
    unsigned long long hi, lo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "(KK):query_task", kwlist, &hi, &lo))
        return NULL;
    kvp_client_t *c;
    kvp_task_info_t info;
    kvp_status_t st = KVP_OK;
    PyObject *ret;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_query_task(c, (kvp_task_id_t){hi, lo}, &info));
    if (kvp_py_call_failed(self, c, st, &ret))
        return ret;
    return Py_BuildValue("{s:I,s:I,s:K,s:K,s:s,s:s}", "kind", info.kind, "status", info.status,
                         "created_ms", (unsigned long long)info.created_ms, "updated_ms",
                         (unsigned long long)info.updated_ms, "assigned", info.assigned, "message",
                         info.message);
}
