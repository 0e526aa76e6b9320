"""kvpool: the Python client of kvpool, a distributed KV-cache store.

    import kvpool, numpy as np
    with kvpool.Client(master="127.0.0.1:50051", segment_size="1GiB") as c:
        c.put("m@blk-1", b"bytes")                  # any buffer: bytes, numpy, ...
        c.get("m@blk-1")                            # -> b"bytes"
        a = np.empty(4096, np.uint8)
        c.batch_get_into(["m@blk-1"], [a])          # -> [5]: zero-copy into a

Every call goes through libkvpool with the GIL released, and one Client may
be shared by any number of threads. Failures raise kvpool.Error (.status, the
kvp_status_t; .name, "KVP_ERR_NOT_FOUND"; the message says what happened).
Batch calls report per key (sizes, or negative statuses such as
kvpool.ERR_NOT_FOUND) and raise only when the whole call failed (the master
unreachable, a timeout, a closed client). Bad Python arguments raise
TypeError or ValueError. Full reference: docs/python.md.
"""

import re as _re
import threading as _threading
import time as _time

from . import _kvpool
from ._version import __version__
from ._kvpool import BufferHandle, Error

#: status name -> number, from libkvpool's one status list ("KVP_ERR_NOT_FOUND": -3)
STATUS = dict(_kvpool.STATUS)
#: number -> status name
STATUS_NAMES = {v: k for k, v in STATUS.items()}
# kvpool.OK, kvpool.ERR_NOT_FOUND, ... (KVP_ prefix dropped)
globals().update({k[4:]: v for k, v in STATUS.items()})

PIN_NONE, PIN_SOFT, PIN_HARD = 0, 1, 2
#: copy and move tasks (Client.copy_task): kinds and states, Mooncake's numbers
COPY_TASK, MOVE_TASK = 0, 1
TASK_PENDING, TASK_PROCESSING, TASK_FAILED, TASK_SUCCESS = 0, 1, 2, 3
PUT_INSERT, PUT_UPSERT = 0, 1
#: preferred_segment meaning "this client's own segment"
SEGMENT_LOCAL = _kvpool.SEGMENT_LOCAL
MAX_BATCH = _kvpool.MAX_BATCH

# Statuses that, carried by every key of a batch, mean the call failed as a whole.
_WHOLE_BATCH = frozenset(
    STATUS[n]
    for n in (
        "KVP_ERR_NOMEM", "KVP_ERR_CONNECT", "KVP_ERR_TIMEOUT",
        "KVP_ERR_PROTOCOL", "KVP_ERR_VERSION", "KVP_ERR_FRAME_TOO_LARGE", "KVP_ERR_SYSTEM",
        "KVP_ERR_SHUTDOWN", "KVP_ERR_INTERNAL", "KVP_ERR_TOO_MANY", "KVP_ERR_NOT_LEADER",
        "KVP_ERR_DENIED",
    )
)

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = _re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", _re.IGNORECASE)


def parse_size(value):
    """A byte count from an int or a string such as "4GB", "512MiB", "64 MB",
    "1024" (units are powers of 1024, as Mooncake reads them). Raises
    ValueError for anything else, negative sizes included."""
    if isinstance(value, bool):
        raise TypeError("a size must be an int or a string like '4GB', not bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size must be >= 0, got {value}")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if not isinstance(value, str):
        raise TypeError(f"a size must be an int or a string like '4GB', not {type(value).__name__}")
    m = _SIZE_RE.match(value)
    if m is None:
        raise ValueError(f"cannot read {value!r} as a size (examples: 4096, '512MB', '4GiB')")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _raise(status, message=None):
    raise _kvpool.error(status, message)


def _raise_key(status, what, key):
    """Raise with the library's words, naming the key when they do not."""
    msg = _kvpool.last_error()
    if status == STATUS["KVP_ERR_DENIED"] and ": " in msg:
        # a refusal: the master's own words (the ACL's reason), naming the key
        msg = f"{what} {key}: {msg.split(': ', 1)[1]}"
    elif not isinstance(key, str) or not key or key not in msg:
        msg = f"{what} {key}: {_kvpool.strerror(status)}"
    raise _kvpool.error(status, msg)


def _raise_async(status, what):
    # An async batch fails on a queue worker: this thread's last-error text is
    # not about it, so the message is the status's own text.
    raise _kvpool.error(status, f"{what}: {_kvpool.strerror(status)}")


def _check_batch(results, what=None):
    """Raise when every key failed with the same whole-call status (`what`:
    an async call, named in the message)."""
    if results:
        r = results[0]
        if r in _WHOLE_BATCH and all(x == r for x in results):
            if what is not None:
                _raise_async(r, what)
            _raise(r)
    return results


def _config(replicas=1, preferred_segment=None, pin=PIN_NONE, soft_pin_ttl_s=0,
            upsert=False, medium=None, group_ids=None, dfs_replica_num=0):
    """The native config tuple: (replicas, preferred_segment, pin, soft_pin_ttl_s, mode,
    medium[, preferred_segments[, group_ids[, dfs_replica_num]]]); None: the defaults."""
    if isinstance(pin, str):
        try:
            pin = {"none": PIN_NONE, "soft": PIN_SOFT, "hard": PIN_HARD}[pin]
        except KeyError:
            raise ValueError(f"pin must be 'none', 'soft' or 'hard', got {pin!r}") from None
    if isinstance(dfs_replica_num, bool) or not isinstance(dfs_replica_num, int) \
            or dfs_replica_num < 0:
        raise ValueError(f"dfs_replica_num must be an int >= 0, got {dfs_replica_num!r}")
    if group_ids is not None and isinstance(group_ids, (str, bytes)):
        raise TypeError("group_ids must be a list of str, one per key")
    if replicas == 1 and preferred_segment is None and pin == PIN_NONE and not soft_pin_ttl_s \
            and not upsert and medium is None and group_ids is None and not dfs_replica_num:
        return None
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an int >= 1, got {replicas!r}")
    names = None
    if isinstance(preferred_segment, (list, tuple)):
        # a segment per replica: replica i on preferred_segment[i] while it has room
        names = tuple(preferred_segment)
        preferred_segment = names[0] if names else None
    cfg = (replicas, preferred_segment, pin, soft_pin_ttl_s,
           PUT_UPSERT if upsert else PUT_INSERT, medium)
    # optional items, each only when it or one after it is given
    tail = [names, tuple(group_ids) if group_ids is not None else None,
            dfs_replica_num or None]
    while tail and tail[-1] is None:
        tail.pop()
    return cfg + tuple(tail)


class Client:
    """A connection to a kvpool master, optionally contributing memory.

    Client(master=None, segment_size=0, transport="auto", rpc_timeout_ms=0, *,
           data_host=None, segment_name=None, rdma_devices=None,
           verify_crc=True, tcp_streams=0, tls_cert=None, tls_key=None, tls_ca=None,
           token=None, segment_tenant=None, segment_file=None, segment_file_offset=0,
           dfs_path=None, tenant_id=None)

    master: "HOST:PORT" or "etcd://HOST:PORT[,...]/CLUSTER"; None: $KVPOOL_MASTER,
    else 127.0.0.1:50051. segment_size: bytes (or "1GiB") of DRAM to mount and
    serve to the pool; 0 mounts nothing. transport: "auto", "tcp", "shm", "rdma"
    (None: $KVPOOL_TRANSPORT, else auto).
    rpc_timeout_ms: master RPC and transfer timeout (0: 10 s). tls_ca (a CA file)
    makes the master connection TLS 1.3; tls_cert/tls_key (mutual TLS) or token name
    this client's principal; each None: $KVPOOL_TLS_CA, $KVPOOL_TLS_CERT,
    $KVPOOL_TLS_KEY, $KVPOOL_TOKEN (so mooncake.store picks them up unchanged).
    segment_tenant dedicates the mounted segment to that tenant (the caller's own; the
    master needs an ACL): only its objects go there. segment_file backs the segment
    with [segment_file_offset, + segment_size) of that file (a regular file of this
    user's, mode 0600; the offset page-aligned) instead of anonymous memory. dfs_path
    names a DFS directory (kvpool serve --dfs-path) this client reads and writes DFS
    replicas in itself, none: $KVPOOL_DFS_PATH, else through their owners.
    tenant_id (None: $KVPOOL_TENANT_ID; "default": none) is Mooncake's: without a
    credential that binds a tenant, the namespace of this client's keys (no other
    tenant_id's keys are seen, nor the default namespace's); with one, the principal's
    tenant, or Error DENIED. The other arguments are kvp_client_params_t's fields of the
    same names.
    """

    def __init__(self, master=None, segment_size=0, transport="auto", rpc_timeout_ms=0, *,
                 data_host=None, segment_name=None, rdma_devices=None, verify_crc=True,
                 tcp_streams=0, tls_cert=None, tls_key=None, tls_ca=None, token=None,
                 segment_tenant=None, segment_file=None, segment_file_offset=0,
                 dfs_path=None, tenant_id=None):
        # dfs_path: a DFS directory this client reads and writes DFS replicas in itself
        # (None: $KVPOOL_DFS_PATH, else through their owners)
        self._c = _kvpool.Client(master, parse_size(segment_size), transport, rpc_timeout_ms,
                                 data_host, segment_name, rdma_devices, bool(verify_crc),
                                 tcp_streams, tls_cert, tls_key, tls_ca, token, segment_tenant,
                                 segment_file, parse_size(segment_file_offset),
                                 dfs_path=dfs_path, tenant_id=tenant_id)
        self._registered = {}  # address -> memoryview holding a registered buffer
        self._lock = _threading.Lock()
        self._aio = None  # kvpool.aio's queue, made by the first async call

    # ---- lifetime ----

    def close(self):
        """Unmount this client's segment (its objects leave the pool) and
        disconnect. Waits for calls in flight; later calls raise Error."""
        aio, self._aio = self._aio, None
        if aio is not None:
            aio.close()
        self._c.close()
        self._registered.clear()

    def drain(self, timeout_s=30.0):
        """Leave the pool gracefully: copy every object whose only replica is in
        this client's segment to other segments (where space allows, within
        timeout_s), then unmount it. -> (moved, lost). The client stays usable
        for gets and puts into other segments. Raises Error (INVALID_ARG: no
        segment; PENDING: a drain is under way)."""
        r = self._c.drain(int(timeout_s * 1000))
        if isinstance(r, int):
            _raise(r)
        return r

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self):
        return self._c.closed

    @property
    def segment_name(self):
        """Name of the segment this client mounts ("host:port"), or None."""
        return self._c.segment_name()

    @property
    def raw(self):
        """The kvpool._kvpool.Client underneath (raw status codes)."""
        return self._c

    # ---- single objects ----

    def put(self, key, data, *, replicas=1, preferred_segment=None, pin=PIN_NONE,
            soft_pin_ttl_s=0, upsert=False, medium=None, group_ids=None, dfs_replica_num=0):
        """Store `data` (bytes or any C-contiguous buffer: numpy array, memoryview,
        ...) under `key`, read straight from its memory. Raises Error: EXISTS
        (the key exists; upsert=True replaces it), POOL_FULL, ... group_ids: [group]
        puts the object in an object group (docs/python.md, "Object groups").
        dfs_replica_num=1: also a replica on a DFS segment (UNSUPPORTED: none mounted)."""
        st = self._c.put(key, data, _config(replicas, preferred_segment, pin, soft_pin_ttl_s,
                                            upsert, medium, group_ids, dfs_replica_num))
        if st != 0:
            _raise(st)

    def put_from(self, key, ptr, size, **config):
        """put from raw memory: an address (host or CUDA device) and a size."""
        st = self._c.put_from(key, ptr, size, _config(**config))
        if st != 0:
            _raise(st)

    def get(self, key):
        """The object's bytes. Raises Error (ERR_NOT_FOUND on a miss)."""
        r = self._c.get(key)
        if isinstance(r, int):
            _raise_key(r, "get", key)
        return r

    def get_into(self, key, buffer):
        """Read the object into `buffer` (a writable C-contiguous buffer, or an
        (address, size) pair); returns its length. Raises Error:
        ERR_NOT_FOUND, ERR_BUFFER_TOO_SMALL (nothing written), ..."""
        if isinstance(buffer, tuple):
            r = self._c.get_into_ptr(key, *buffer)
        else:
            r = self._c.get_into(key, buffer)
        if r < 0:
            _raise(r)
        return r

    def size(self, key):
        """The object's length in bytes. Raises Error (ERR_NOT_FOUND)."""
        r = self._c.get_size(key)
        if r < 0:
            _raise_key(r, "size", key)
        return r

    def exists(self, key):
        """True if a complete object has this key."""
        r = self._c.is_exist(key)
        if r < 0:
            _raise(r)
        return r == 1

    def remove(self, key, force=False):
        """Remove one object. Raises Error: ERR_NOT_FOUND, ERR_LEASED (being
        read; force=True removes it anyway), ..."""
        st = self._c.remove(key, bool(force))
        if st != 0:
            _raise(st)

    def remove_all(self, force=False):
        """Remove every complete object in the pool; returns how many."""
        r = self._c.remove_all(bool(force))
        if r < 0:
            _raise(r)
        return r

    def remove_by_regex(self, pattern, force=False):
        """Remove every complete object whose key matches the POSIX extended
        regular expression `pattern`; returns how many."""
        r = self._c.remove_by_regex(pattern, bool(force))
        if r < 0:
            _raise(r)
        return r

    # ---- batches ----

    def batch_put(self, keys, buffers, *, replicas=1, preferred_segment=None, pin=PIN_NONE,
                  soft_pin_ttl_s=0, upsert=False, medium=None, group_ids=None,
                  dfs_replica_num=0):
        """Store keys[i] from buffers[i]: buffer objects (numpy arrays, bytes, ...)
        or (address, size) pairs of ints (torch: (t.data_ptr(), t.nbytes); CUDA
        addresses go to the library as they are). Returns a status per key:
        0, or negative (kvpool.ERR_EXISTS, ERR_POOL_FULL, ...)."""
        cfg = _config(replicas, preferred_segment, pin, soft_pin_ttl_s, upsert, medium,
                      group_ids, dfs_replica_num)
        return _check_batch(self._c.batch_put(keys, buffers, cfg))

    def batch_get_into(self, keys, buffers):
        """Read keys[i] into buffers[i] (writable buffers or (address, size)
        pairs). Returns per key the object's length, or a negative status
        (kvpool.ERR_NOT_FOUND, ERR_BUFFER_TOO_SMALL, ...)."""
        return _check_batch(self._c.batch_get_into(keys, buffers))

    def batch_put_multi(self, keys, buffers, **config):
        """Store keys[i] from the concatenation of buffers[i], a list of buffer
        objects or (address, size) pairs (say one per layer), without copying
        them together. Returns a status per key."""
        ptrs, sizes = _split_multi(buffers, False)
        return _check_batch(self._c.batch_put_multi(keys, ptrs, sizes, _config(**config)))

    def batch_get_into_multi(self, keys, buffers):
        """Read keys[i] scattered over buffers[i] (writable buffer objects or
        (address, size) pairs), in order. Returns per key the object's length,
        or a negative status (ERR_BUFFER_TOO_SMALL when they cannot hold it)."""
        ptrs, sizes = _split_multi(buffers, True)
        return _check_batch(self._c.batch_get_into_multi(keys, ptrs, sizes))

    def batch_exists(self, keys):
        """[bool] per key: whether a complete object has it (a per-key failure raises,
        naming the key)."""
        return self._c.batch_exists_bools(keys)

    def cached_prefix(self, keys):
        """How many leading keys all exist: the longest cached prefix."""
        res, prefix = self._c.batch_exists(keys)
        _check_batch(res)
        return prefix

    def batch_remove(self, keys, force=False):
        """Remove keys; a status per key."""
        return _check_batch(self._c.batch_remove(keys, bool(force)))

    def batch_get(self, keys):
        """[bytes or None] per key (None: missing), each in memory of its own."""
        out = []
        for h in _check_batch(self._c.batch_get_buffer(keys)):
            if isinstance(h, int):
                if h != STATUS["KVP_ERR_NOT_FOUND"]:
                    _raise(h)
                out.append(None)
            else:
                out.append(bytes(h))
        return out

    def get_ranges(self, ranges):
        """Ranged reads: ranges is a list of (key, offset, buffer) where buffer is
        a writable buffer or an (address, length) pair; each reads bytes
        [offset, offset + length) of its object. Returns per range the bytes
        read (fewer at the object's end) or a negative status (ERR_NOT_FOUND,
        ERR_OUT_OF_RANGE). Not CRC-checked: the stored CRC covers whole objects."""
        return _check_batch(self._c.get_ranges(ranges))

    # ---- transfer sessions ----

    def get_session_start(self, keys):
        """Look up each key's replicas and take its read lease once, for the ranged
        reads of get_session_ranges (no master call each). A status per key."""
        return _check_batch(self._c.get_session_start(keys))

    def get_session_ranges(self, keys, buffers, offsets):
        """Key i's ranges, read with no master call: buffers[i][j] (a writable buffer
        or an (address, size) pair) gets its size in bytes of the object from
        offsets[i][j]. Per key the bytes read, or a negative status
        (ERR_INVALID_ARG: no get session, or a range past the object's end;
        ERR_LEASE_EXPIRED: the lease ended, the session is dropped)."""
        ptrs, sizes = _split_multi(buffers, True)
        return _check_batch(self._c.get_session_ranges(keys, ptrs, sizes, offsets))

    def get_session_end(self, keys):
        """Drop the keys' get sessions (their leases handed back)."""
        _check_batch([self._c.get_session_end(keys)])

    def put_session_start(self, keys, sizes, **config):
        """Reserve each object of sizes[i] bytes, invisible until put_session_end
        (config as put's). A status per key (ERR_INVALID_ARG: already in a put
        session)."""
        return _check_batch(self._c.put_session_start(keys, sizes, _config(**config)))

    def put_session_ranges(self, keys, buffers, offsets):
        """Key i's ranges, written with no master call into every replica: buffers[i][j]
        (a buffer or an (address, size) pair) at object offset offsets[i][j]. Per key
        the bytes written, or a negative status."""
        ptrs, sizes = _split_multi(buffers, False)
        return _check_batch(self._c.put_session_ranges(keys, ptrs, sizes, offsets))

    def put_session_end(self, keys):
        """Make the objects visible (each byte must have been written). A status per
        key."""
        return _check_batch(self._c.put_session_end(keys))

    def put_session_revoke(self, keys):
        """Drop the puts: the keys stay absent. A status per key."""
        return _check_batch(self._c.put_session_revoke(keys))

    # ---- memory registration ----

    def register_buffer(self, buffer, size=None):
        """Register memory for transfers (RDMA: registered with the NIC once,
        then zero-copy): a buffer object (kept alive until unregistered), or an
        address and a size (host or CUDA device memory)."""
        if isinstance(buffer, int) and not isinstance(buffer, bool):
            if size is None:
                raise TypeError("register_buffer(address, size): the size is missing")
            st = self._c.register_buffer(buffer, size)
        else:
            view = memoryview(buffer)
            addr, nbytes = _kvpool.buffer_info(view)
            st = self._c.register_buffer(addr, nbytes if size is None else size)
            if st == 0:
                with self._lock:
                    self._registered[addr] = view
        if st != 0:
            _raise(st)

    def unregister_buffer(self, buffer):
        """Undo register_buffer (an address, or the buffer object)."""
        if isinstance(buffer, int) and not isinstance(buffer, bool):
            addr = buffer
        else:
            addr, _ = _kvpool.buffer_info(buffer)
        st = self._c.unregister_buffer(addr)
        with self._lock:
            view = self._registered.pop(addr, None)
        if view is not None:
            view.release()
        if st != 0:
            _raise(st)

    # ---- admin ----

    def stat(self):
        """The pool as the master sees it: capacity, used, objects, segments, ..."""
        r = self._c.stat()
        if isinstance(r, int):
            _raise(r)
        return r

    def metrics(self):
        """This client's own counters since it was created (kvp_metrics_snapshot):

        {"version": 2,
         "client": {TRANSPORT: {"put": {"ops", "bytes"}, "get": {"ops", "bytes"}}},
                    # what this client moved, TRANSPORT in tcp, shm, rdma, ssd
         "errors": {"put": n, "get": n},
         "staged": {"host": {"ops", "bytes"}, "gpu": {"ops", "bytes"}},
         "served": {"tcp" | "ssd": {"put": {...}, "get": {...}}},
                    # what peers did to this client's segments through its data
                    # servers (one-sided shm and rdma transfers are not seen)
         "ssd_io": {"read": {...}, "write": {...}, "errors": n},
         "refused_protected": n,
                    # peers of other hosts its data servers refused (protected mode)
         "segments": [{"name", "tier", "capacity", "mounted", "draining"}],
         "master_rpc": {METHOD: {"calls", "failed", "wait_s"}},
                    # its calls to the master by method (put_start, put_end,
                    # get_replica_list, exist, remove, lease_release, ...): made,
                    # unanswered, and the seconds they waited for their answers
         "transfer": {"put": {"batches", "seconds"}, "get": {...}}}
                    # the batches of transfers its puts and gets ran, and their time:
                    # with master_rpc, where a batch's time goes

        An op is one object extent moved (a replica; a multi-buffer object counts
        one per buffer)."""
        r = self._c.metrics()
        if isinstance(r, int):
            _raise(r)
        return r

    def metrics_text(self):
        """The same counters in the Prometheus text exposition format."""
        r = self._c.metrics_text()
        if isinstance(r, int):
            _raise(r)
        return r

    def list_keys(self, pattern=None, max=1000):
        """Keys matching a POSIX extended regex (None: all), at most `max`: a
        list of dicts (key, size, complete, replicas, lease_ms, pin)."""
        r = self._c.list_keys(pattern, max)
        if isinstance(r, int):
            _raise(r)
        return r

    # ---- copy and move tasks ----

    def copy_task(self, key, targets):
        """Start copying `key` to each segment named in `targets` (1..8; one that
        holds a replica already needs nothing), done in the background by the
        owner of a source replica. -> the task's id, a pair of ints, for
        query_task. Raises Error: NOT_FOUND (no such object), INVALID_ARG (a target
        not mounted, on SSD, or taking no new replicas: the error's message says
        which)."""
        r = self._c.create_copy_task(key, list(targets))
        if isinstance(r, int):
            _raise(r, _kvpool.last_error())
        return r

    def move_task(self, key, source, target):
        """Start moving `key`'s replica on segment `source` to segment `target`.
        -> the task's id. Raises Error as copy_task."""
        r = self._c.create_move_task(key, source, target)
        if isinstance(r, int):
            _raise(r, _kvpool.last_error())
        return r

    def query_task(self, task_id):
        """Where a task stands: a dict of kind (COPY_TASK, MOVE_TASK), status
        (TASK_PENDING, TASK_PROCESSING, TASK_FAILED, TASK_SUCCESS), created_ms,
        updated_ms (wall clock), assigned (the source segment) and message (why it
        failed). Raises Error NOT_FOUND: no task of this client's tenant has that
        id (the master keeps the 4096 newest ended ones); a task of a master that
        has since restarted or failed over is TASK_FAILED, saying so."""
        r = self._c.query_task(tuple(task_id))
        if isinstance(r, int):
            _raise(r)
        return r

    def wait_task(self, task_id, timeout_s=30.0):
        """query_task until the task ends (SUCCESS or FAILED) or timeout_s passes;
        the last answer."""
        deadline = _time.monotonic() + timeout_s
        while True:
            r = self.query_task(task_id)
            if r["status"] in (TASK_FAILED, TASK_SUCCESS) or _time.monotonic() >= deadline:
                return r
            _time.sleep(0.05)

    # ---- asyncio ----

    def _queue(self):
        if self._aio is None:
            from . import aio
            with self._lock:
                if self._aio is None:
                    self._aio = aio.Queue(self._c)
        return self._aio

    async def aget(self, key):
        """await: the object's bytes (Error on a miss)."""
        return await self._queue().get(key)

    async def aget_into(self, key, buffer):
        """await: read into a buffer (or an (address, size) pair); its length."""
        r = (await self._queue().batch_get_into([key], [buffer]))[0]
        if r < 0:
            _raise_async(r, f"get {key}")
        return r

    async def aput(self, key, data, **config):
        """await: store data under key (raises as put)."""
        st = (await self._queue().batch_put([key], [data], _config(**config)))[0]
        if st != 0:
            _raise_async(st, f"put {key}")

    async def aexists(self, key):
        """await: whether the key exists."""
        r = (await self._queue().batch_exists([key]))[0]
        if r < 0:
            _raise_async(r, f"exist {key}")
        return r == 1

    async def abatch_put(self, keys, buffers, **config):
        """await: batch_put."""
        return _check_batch(await self._queue().batch_put(keys, buffers, _config(**config)),
                            "put")

    async def abatch_get_into(self, keys, buffers):
        """await: batch_get_into."""
        return _check_batch(await self._queue().batch_get_into(keys, buffers), "get")

    async def abatch_exists(self, keys):
        """await: batch_exists."""
        res = await self._queue().batch_exists(keys)
        for k, r in zip(keys, res):
            if r < 0:
                _raise_async(r, f"exist {k!r}")
        return [r == 1 for r in res]


def _split_multi(buffers, writable):
    """[[buffer or (ptr, size), ...], ...] -> ([[ptr]], [[size]]). The buffer
    objects stay referenced by the caller's lists for the call."""
    if isinstance(buffers, (str, bytes)) or not hasattr(buffers, "__len__"):
        raise TypeError("buffers must be a list (one per key) of lists of buffers or "
                        "(address, size) pairs")
    ptrs, sizes = [], []
    for i, parts in enumerate(buffers):
        if isinstance(parts, (str, bytes)) or not hasattr(parts, "__iter__"):
            raise TypeError(f"buffers[{i}] must be a list of buffers or (address, size) pairs")
        p_i, s_i = [], []
        for part in parts:
            if isinstance(part, tuple) and len(part) == 2:
                p, n = part
            else:
                p, n = _kvpool.buffer_info(part, writable)
            p_i.append(p)
            s_i.append(n)
        ptrs.append(p_i)
        sizes.append(s_i)
    return ptrs, sizes


__all__ = [
    "Client", "Error", "BufferHandle", "STATUS", "STATUS_NAMES", "parse_size",
    "PIN_NONE", "PIN_SOFT", "PIN_HARD", "SEGMENT_LOCAL", "MAX_BATCH",
] + [k[4:] for k in STATUS]
