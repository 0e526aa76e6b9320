"""mooncake.store on kvpool: Mooncake's connector API, served by a kvpool pool.

vLLM, LMCache, SGLang HiCache and vllm-ascend do

    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

and get this module when kvpool's Python package is on the path instead of
Mooncake's. Every method takes the arguments the connectors pass (pointers as
ints, lists of lists for the multi-buffer calls) and returns Mooncake's
integer conventions: 0 or a negative Mooncake ErrorCode (codes.py maps each
kvpool status to one), byte counts for gets, b"" for a get that misses. A put
of a key that exists returns 0. Bad arguments return -600 (INVALID_PARAMS),
never raise. Data calls release the GIL; one store may be shared by threads.

setup() maps Mooncake's arguments to kvpool's: master_server_addr is the
kvpool master ("HOST:PORT" or "etcd://HOST:PORT[,...]/CLUSTER"),
global_segment_size the DRAM this process contributes to the pool (0: none),
protocol "rdma" or "tcp" the transport (anything else: auto, i.e. shm on the
same host), rdma_devices the RDMA devices, local_hostname the address the
segment's data server binds and advertises. tenant_id is Mooncake's: without
a credential that binds a tenant, the namespace of the store's keys (stores of
two tenant_ids never see each other's keys); with one (KVPOOL_TOKEN or
KVPOOL_TLS_CERT and a master's ACL), it must be the principal's tenant, else
setup() returns -601 (ILLEGAL_CLIENT, as for a refused credential) and logs
why ("default", the default: no tenant named). metadata_server, engine and
the SSD arguments are accepted and not used (kvpool needs no metadata
server; its SSD tier is set up on `kvpool serve`). enable_client_http_server
serves the client's /metrics and /health on client_http_port (_metrics_http.py).
kvpool needs no transfer buffer either, but a local_buffer_size of 0 makes
the calls Mooncake copies through that buffer (put, put_batch, put_parts,
the upserts of bytes, get, get_batch, get_buffer, batch_get_buffer,
get_tensor, batch_get_tensor) refuse, as Mooncake's do: -600, b"" or None.
"""

import ctypes as _ctypes
import logging as _logging
import mmap as _mmap
import os as _os
import random as _random
import re as _re
import threading as _threading

import kvpool as _kvpool
from kvpool import _kvpool as _raw
from kvpool._kvpool import BufferHandle  # get_buffer's: Mooncake's name for it

from . import _safetensors, codes
from ._parallel import ParallelAPI
from ._tensor_api import TensorAPI, _put_code
from ._engram import EngramStore, EngramStoreConfig
from ._metrics_http import MetricsServer as _MetricsServer
from ._buffer_pool import (BufferLease, BufferLeaseView, BufferPool, RegisteredBufferLease,
                           RegisteredBufferLeaseView, RegisteredBufferPool)
from ._tensor import deserialize as _deserialize_tensor
from ._tensor import metadata_size as _tensor_metadata_size
from ._tensor import serialize as _serialize_tensor
from ._types import (EXPORTED_VALUES, ObjectDataType, ParallelAxis, QueryTaskResponse,
                     ReadTarget, ReplicaStatus, ReplicateConfig, SoftPinAction, TaskStatus,
                     TaskType, TensorParallelism)
from .codes import INTERNAL_ERROR, INVALID_PARAMS, OK
from .codes import to_mooncake as _code

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "ReplicaDescriptor", "codes",
           "SoftPinAction", "ObjectDataType", "ReplicaStatus", "TaskType", "TaskStatus",
           "QueryTaskResponse", "ParallelAxis", "TensorParallelism", "ReadTarget",
           "BufferPool", "BufferLease", "BufferLeaseView", "RegisteredBufferPool",
           "RegisteredBufferLease", "RegisteredBufferLeaseView", "MooncakeHostMemAllocator",
           "BufferHandle", "MemoryDescriptor", "EngramStore", "EngramStoreConfig"]

# Mooncake's module exports the members of ObjectDataType, ReplicaStatus, TaskType and
# TaskStatus as module attributes too (pybind11's export_values()).
globals().update(EXPORTED_VALUES)

_log = _logging.getLogger(__name__)

# alloc_from_mem_pool's memory: (mapping, its ctypes view), kept mapped until the process
# exits, as Mooncake's ShmHelper keeps its shared memory (freed by its destructor)
_MEM_POOL = []
_HOST_MEM = {}  # MooncakeHostMemAllocator's: address -> its mapping
_MEM_POOL_LOCK = _threading.Lock()

_BAD_INPUT = (TypeError, ValueError, OverflowError, BufferError)


#: Mooncake's default max_kv_soft_pin_ttl (types.h: 24 h); a longer TTL is -600
_MAX_SOFT_PIN_TTL_MS = 24 * 60 * 60 * 1000


class _Refused(Exception):
    """A request refused with this Mooncake code (not -600)."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


def _n(keys):
    try:
        return len(keys)
    except TypeError:
        return 0


def _host_of(local_hostname):
    """Mooncake's local_hostname ("10.0.0.5", "node1:12345", "[::1]:5") as a bind host."""
    h = (local_hostname or "").strip()
    if not h:
        return None
    m = _re.match(r"^\[(.*)\](?::\d+)?$", h)
    if m:
        return m.group(1)
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h or None


# Mooncake's RPC ports: a local_hostname without one gets one of these, as Mooncake's
# client does, and its segment is named "host:port" (what get_hostname() answers and what
# preferred_segment, copy and move tasks name it by).
_PORT_LO, _PORT_HI = 12300, 14300


def _segment_names(local_hostname):
    """The names setup's segment tries in turn: local_hostname itself when it has a port,
    else host:port with ports drawn from Mooncake's range; [] without a hostname (kvpool
    names it)."""
    h = (local_hostname or "").strip()
    if not h:
        return []
    first = []
    if _re.match(r"^\[.*\]:\d+$", h) or (h.count(":") == 1 and _re.match(r".*:\d+$", h)):
        # its own port first; when another segment has that name (a second store of one
        # process given the same local_hostname), ports drawn on the same host
        first, h = [h], h.rsplit(":", 1)[0]
    host = f"[{h}]" if ":" in h and not h.startswith("[") else h
    rnd = _random.Random()
    return first + [f"{host}:{rnd.randrange(_PORT_LO, _PORT_HI)}" for _ in range(8)]


def _transport(protocol):
    p = (protocol or "").lower()
    return p if p in ("rdma", "tcp") else "auto"


class MooncakeDistributedStore(TensorAPI, ParallelAPI):
    """Mooncake's store client, backed by a kvpool.Client (see the module doc).

    Byte calls (put/get, the _from/_into forms with raw pointers, the multi-buffer
    batches), the tensor API (put_tensor, get_tensor, their batch, _into, _from,
    upsert, pub, _with_tp and _with_parallelism forms; torch imported on first
    use; _parallel.py has the parallel layouts) and the
    housekeeping calls (remove*, is_exist, health_check, get_hostname,
    get_replica_desc), segments mounted at run time (mount_segment,
    allocate_and_mount_segment and their unmounts), and the transfer sessions
    (batch_get_session_*, batch_put_session_*, the *_multi_buffer_ranges calls).
    Methods of Mooncake's binding that kvpool cannot honour raise NotImplementedError
    naming themselves.
    """

    def __init__(self):
        """A store that is not set up yet: call setup() or setup_dummy()."""
        self._c = None  # kvpool._kvpool.Client
        self._hostname = ""
        self._lock = _threading.Lock()
        self._args = None  # (master, data_host, rdma_devices) of setup, for mounted segments
        self._mounted = {}  # segment id -> (kind "file" | "alloc", kvpool._kvpool.Client)
        self._regs = {}  # registered buffers of self._c: ptr -> size (get_into_ranges' bounds)
        self._dummy = False  # set up by setup_dummy (alloc_from_mem_pool allocates)
        self._buffer_size = 0  # setup's local_buffer_size: 0 refuses the byte-copying calls
        self._http = None  # the client HTTP server (enable_client_http_server)

    # ---- setup ----

    def setup(self, local_hostname=None, metadata_server=None, global_segment_size=0,
              local_buffer_size=0, protocol="tcp", rdma_devices="", master_server_addr=None,
              engine=None, enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
              enable_client_http_server=False, client_http_port=9300, config=None):
        """setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, rdma_devices, master_server_addr, engine=None,
        ...) or setup(config: dict) (also as setup(config=...)) -> 0, or a negative
        Mooncake code."""
        if config is not None:
            if local_hostname is not None:
                return INVALID_PARAMS  # both forms at once
            local_hostname = config
            if not isinstance(config, dict):
                return INVALID_PARAMS
        if isinstance(local_hostname, dict):
            cfg = local_hostname
            local_hostname = cfg.get("local_hostname")
            global_segment_size = cfg.get("global_segment_size", 0)
            protocol = cfg.get("protocol", "tcp")
            rdma_devices = cfg.get("rdma_devices", cfg.get("device_name", ""))
            # Mooncake's default when the key is missing: a buffer (16 MiB)
            local_buffer_size = cfg.get("local_buffer_size", 16 << 20)
            master_server_addr = cfg.get("master_server_address",
                                         cfg.get("master_server_addr"))
            tenant_id = cfg.get("tenant_id", "default")
            enable_client_http_server = cfg.get("enable_client_http_server", False)
            client_http_port = cfg.get("client_http_port", 9300)
        if enable_client_http_server and (isinstance(client_http_port, bool) or
                                          not isinstance(client_http_port, int) or
                                          not 0 < client_http_port <= 65535):
            _log.error("setup(): client_http_port %r is no port", client_http_port)
            return INVALID_PARAMS
        try:
            seg = _kvpool.parse_size(global_segment_size)
            buffer_size = _kvpool.parse_size(local_buffer_size)
            for v in (local_hostname, protocol, rdma_devices, master_server_addr, tenant_id):
                if v is not None and not isinstance(v, str):
                    raise TypeError("host, protocol, devices, master and tenant_id must be str")
        except _BAD_INPUT:
            return INVALID_PARAMS
        # Mooncake's empty tenant_id is its "default": no tenant named, and then the
        # library reads $KVPOOL_TENANT_ID, as the other settings read theirs
        tenant = tenant_id if tenant_id not in (None, "", "default") else None
        data_host = _host_of(local_hostname) if seg > 0 else None
        args = (master_server_addr or None, _host_of(local_hostname), rdma_devices or None)
        names = _segment_names(local_hostname) if seg > 0 else []
        for i, name in enumerate(names or [None]):
            try:
                # Mooncake's DFS root: this client reads and writes DFS replicas there
                # itself (else $KVPOOL_DFS_PATH, read by the library)
                c = _raw.Client(master_server_addr or None, seg, _transport(protocol), 0,
                                data_host, name, rdma_devices or None, True, 0,
                                dfs_path=_os.environ.get("MOONCAKE_DFS_ROOT_DIR") or None,
                                tenant_id=tenant)
                break
            except _kvpool.Error as e:
                # a drawn port whose name another segment has: the next one
                if e.status != _kvpool.ERR_EXISTS or len(names) < 2 or i + 1 == len(names):
                    _log.warning("setup() failed: %s", e)
                    return _code(e.status)
            except _BAD_INPUT:
                return INVALID_PARAMS
        http = None
        if enable_client_http_server:  # Mooncake's client HTTP server: /metrics, /health
            try:
                http = _MetricsServer(_host_of(local_hostname) or "127.0.0.1", client_http_port,
                                      c.metrics_text, lambda: self._c is c)
            except OSError as e:  # as Mooncake's: the store works on without it
                _log.warning("setup(): the client HTTP server cannot listen on port %d (%s); "
                             "going on without it", client_http_port, e)
        with self._lock:
            old, self._c = self._c, c
            old_http, self._http = self._http, http
            self._regs = {}
            self._hostname = local_hostname or ""
            self._dummy = False
            self._buffer_size = buffer_size
            self._args = args
            mounted, self._mounted = self._mounted, {}
        for _kind, m in mounted.values():
            m.close()
        if old_http is not None:
            old_http.close()
        if old is not None:
            old.close()
        return OK

    def init_all(self, protocol, device_name, mount_segment_size=16 << 20):
        """Mooncake's init_all: setup() with Mooncake's fixed arguments (local
        hostname "localhost:12345", a 1 GiB local buffer, the master at
        127.0.0.1:50051 unless MOONCAKE_MASTER or KVPOOL_MASTER names another)
        and a segment of mount_segment_size. -600 when the store is set up
        already, as Mooncake's refuses a second init."""
        if self._c is not None:
            return INVALID_PARAMS
        master = (_os.environ.get("MOONCAKE_MASTER") or _os.environ.get("KVPOOL_MASTER")
                  or "127.0.0.1:50051")
        return self.setup("localhost:12345", "127.0.0.1:2379", mount_segment_size, 1 << 30,
                          protocol, device_name, master)

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Mooncake's dummy client (memory served by another process): a kvpool
        client of the master at server_address that mounts nothing; the sizes
        are accepted and not used. 0, or a negative code."""
        try:
            _kvpool.parse_size(mem_pool_size)
            _kvpool.parse_size(local_buffer_size)
            if not isinstance(server_address, str):
                raise TypeError("server_address must be str")
        except _BAD_INPUT:
            return INVALID_PARAMS
        r = self.setup("", "", 0, local_buffer_size, "auto", "", server_address)
        if r == OK:
            self._dummy = True
        return r

    def alloc_from_mem_pool(self, size):
        """Mooncake's dummy-client call: size bytes of shared memory (page-aligned,
        zeroed, MAP_SHARED) for the caller to fill, register_buffer and hand to
        the pointer calls. Returns its address as an int, or 0: a store not set
        up with setup_dummy (Mooncake's real client answers 0 too), size 0, or
        the mapping failed. The memory stays mapped until the process exits, as
        Mooncake's ShmHelper keeps it; there is no call to free it."""
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 1 << 64:
            raise TypeError("alloc_from_mem_pool(): size must be an int >= 0")
        if not self._dummy or self._c is None or size == 0:
            return 0
        try:
            m = _mmap.mmap(-1, size)
        except (OSError, ValueError, OverflowError):
            return 0
        view = (_ctypes.c_char * size).from_buffer(m)
        with _MEM_POOL_LOCK:
            _MEM_POOL.append((m, view))
        return _ctypes.addressof(view)

    def close(self):
        """Unmount this store's segments (setup's and those mounted since) and
        disconnect. 0."""
        with self._lock:
            c, self._c = self._c, None
            http, self._http = self._http, None
            self._regs = {}
            mounted, self._mounted = self._mounted, {}
        if http is not None:
            http.close()
        for _kind, m in mounted.values():
            m.close()
        if c is not None:
            c.close()
        return OK

    def get_hostname(self):
        """The name of this store's segment (what preferred_segment takes), or
        local_hostname when it contributes none."""
        c = self._c
        try:
            name = c.segment_name() if c is not None else None
        except _kvpool.Error:
            name = None
        return name or self._hostname

    # ---- segments at run time ----

    def _mount(self, kind, size, protocol, location, path=None, offset=0):
        """Mount one more segment of this process's memory: a kvpool client of the
        same master that contributes it (its own data server and heartbeat; the
        store's calls still go through setup's client). -> (code, [id], size)."""
        try:
            size = _kvpool.parse_size(size)
            offset = _kvpool.parse_size(offset)
            if not isinstance(protocol, str) or not isinstance(location, str):
                raise TypeError("protocol and location must be str")
            if path is not None and not isinstance(path, str):
                raise TypeError("path must be str")
        except _BAD_INPUT:
            return INVALID_PARAMS, [], 0
        if size == 0 or not (location == "" or location.startswith("cpu")):
            # kvpool segments are host memory ("cpu", "cpu:N" or ""), never device memory
            return INVALID_PARAMS, [], 0
        with self._lock:
            args = self._args if self._c is not None else None
        if args is None:
            return INTERNAL_ERROR, [], 0
        try:
            m = _raw.Client(args[0], size, _transport(protocol), 0, args[1], None, args[2], True,
                            0, segment_file=path, segment_file_offset=offset)
        except _kvpool.Error as e:
            st = getattr(e, "status", None)
            return (_code(st) if isinstance(st, int) and st < 0 else INTERNAL_ERROR), [], 0
        except _BAD_INPUT:
            return INVALID_PARAMS, [], 0
        sid = m.segment_name()
        with self._lock:
            if self._c is None:  # closed meanwhile
                m.close()
                return INTERNAL_ERROR, [], 0
            self._mounted[sid] = (kind, m)
        return OK, [sid], size

    def _unmount(self, kind, segment_ids, grace_period_seconds):
        if isinstance(segment_ids, str):
            segment_ids = [segment_ids]
        try:
            ids = list(segment_ids)
            grace = float(grace_period_seconds)
            if not grace >= 0 or not all(isinstance(i, str) for i in ids):  # NaN too
                raise ValueError("segment ids must be str, the grace period >= 0")
        except _BAD_INPUT:
            return INVALID_PARAMS
        first = OK
        for sid in ids:
            with self._lock:
                entry = self._mounted.get(sid)
                if entry is None or entry[0] != kind:
                    entry = None
                else:
                    del self._mounted[sid]
            if entry is None:  # not one this store mounted this way
                first = first or INVALID_PARAMS
                continue
            m = entry[1]
            if grace > 0:  # move its objects to other segments first, for up to grace s
                r = m.drain(0xFFFFFFFF if grace >= 4294967 else int(grace * 1000))
                if isinstance(r, int) and r < 0:
                    first = first or _code(r)
            m.close()
        return first

    def mount_segment(self, path, size, offset=0, protocol="tcp", location=""):
        """Mount [offset, offset + size) of the file at path (MAP_SHARED; a
        regular file of this user's, mode 0600, offset page-aligned) as one more
        segment of the pool, served by this process. -> {"ret": 0 or negative,
        "segment_ids": [id]}; unmount it with unmount_segment(ids)."""
        code, ids, _ = self._mount("file", size, protocol, location, path, offset)
        return {"ret": code, "segment_ids": ids}

    def unmount_segment(self, segment_ids, grace_period_seconds=0):
        """Unmount segments mount_segment mounted (a list of ids). With a grace
        period their objects are first moved to other segments (for up to that
        many seconds); without, they leave the pool at once. 0, or the first
        negative code (-600: an id this store did not mount)."""
        return self._unmount("file", segment_ids, grace_period_seconds)

    def allocate_and_mount_segment(self, size, protocol="tcp", location=""):
        """Allocate size bytes of host memory and mount them as one more segment
        of the pool, served by this process. -> {"ret": 0 or negative,
        "segment_ids": [id], "allocated_size": bytes}; free it with
        unmount_and_free_segment(ids)."""
        code, ids, n = self._mount("alloc", size, protocol, location)
        return {"ret": code, "segment_ids": ids, "allocated_size": n}

    def unmount_and_free_segment(self, segment_ids, grace_period_seconds=0):
        """Unmount and free segments allocate_and_mount_segment mounted, as
        unmount_segment does. 0, or the first negative code."""
        return self._unmount("alloc", segment_ids, grace_period_seconds)

    # ---- helpers ----

    def _client(self):
        c = self._c
        if c is None:
            raise _kvpool.Error("the store is not set up (call setup first)")
        return c

    def _cfg(self, config):
        """A ReplicateConfig as kvpool's put config, refused as Mooncake's master
        refuses it (PutStart, ResolveSoftPinRequest): no replica of any kind,
        more than one DFS replica or one without a memory replica, NoF replicas
        (kvpool has no NoF pool, as a Mooncake built without it), NoF with
        prefer_alloc_in_same_node, a soft_pin_ttl_ms without ENABLE or over 24 h
        -> -600 (ValueError). A DFS replica goes to the master (dfs_replica_num 1): no
        DFS segment mounted -> -1601 DFS_SERVICE_UNAVAILABLE, a full DFS -> -200."""
        if config is None:
            # Mooncake's master places a writer's replicas on its own host's segments
            # first (writer_host_id): this store's own segment, while it has room
            return (1, _kvpool.SEGMENT_LOCAL, _kvpool.PIN_NONE, 0, _kvpool.PUT_INSERT, None)
        if not isinstance(config, ReplicateConfig) and not hasattr(config, "replica_num"):
            raise TypeError("config must be a ReplicateConfig")
        counts = [getattr(config, f, d) for f, d in
                  (("replica_num", 1), ("nof_replica_num", 0), ("dfs_replica_num", 0))]
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts):
            raise TypeError("replica_num, nof_replica_num and dfs_replica_num must be ints >= 0")
        replica_num, nof, dfs = counts
        if replica_num == 0 and nof == 0 and dfs == 0:
            raise ValueError("no replica asked for")
        if dfs > 1 or (dfs > 0 and replica_num == 0):
            raise ValueError("at most one DFS replica, and only with a memory replica")
        if nof > 0:  # with prefer_alloc_in_same_node too: both -600 in Mooncake
            raise ValueError("kvpool has no NoF pool")
        action = getattr(config, "soft_pin_action", None)
        ttl_ms = getattr(config, "soft_pin_ttl_ms", None)
        if action is None:  # an object of the older Mooncake's fields
            action = (SoftPinAction.ENABLE if getattr(config, "with_soft_pin", False)
                      else SoftPinAction.PRESERVE)
            ttl_ms = ttl_ms or None
        if not isinstance(action, SoftPinAction):
            raise TypeError("soft_pin_action must be a SoftPinAction")
        if ttl_ms is not None and (isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int)
                                   or ttl_ms < 0):
            raise TypeError("soft_pin_ttl_ms must be None or an int >= 0")
        if ttl_ms is not None and (action is not SoftPinAction.ENABLE
                                   or ttl_ms > _MAX_SOFT_PIN_TTL_MS):
            raise ValueError("soft_pin_ttl_ms needs SoftPinAction.ENABLE and <= 24 h")
        seg = getattr(config, "preferred_segment", "") or ""
        segs = list(getattr(config, "preferred_segments", []) or [])
        if not seg:
            seg = segs[0] if segs else ""
        # more than one: replica i on segs[i] while it has room (the master's placement)
        pref = (tuple(segs[:8]),) if len(segs) > 1 else ()
        if not seg:  # as with no config (prefer_alloc_in_same_node: the same)
            seg = _kvpool.SEGMENT_LOCAL
        if not isinstance(seg, str):
            raise TypeError("preferred_segment must be str")
        pin, ttl = _kvpool.PIN_NONE, 0
        if getattr(config, "with_hard_pin", False):
            pin = _kvpool.PIN_HARD
        elif action is SoftPinAction.ENABLE and ttl_ms != 0:
            # kvpool's soft pins last whole seconds; None: the master's default (30 min,
            # Mooncake's default_kv_soft_pin_ttl too); 0 ms would expire at once: no pin
            pin = _kvpool.PIN_SOFT
            ttl = 0 if ttl_ms is None else (ttl_ms + 999) // 1000
        cfg = (replica_num, seg or None, pin, ttl, _kvpool.PUT_INSERT, None) + pref
        # object groups: one id per key of the call ("" ungrouped), None: none named (an
        # upsert keeps the object's group); a count other than the keys' -> -600 per key
        # (the library's INVALID_ARG), an upsert that moves a group -> -600 (the master's)
        groups = getattr(config, "group_ids", None)
        if groups is not None:
            if isinstance(groups, (str, bytes)) or not all(isinstance(g, str) for g in groups):
                raise TypeError("group_ids must be None or a list of str")
            cfg = cfg + (None,) * (7 - len(cfg)) + (tuple(groups),)
        if dfs:  # the 9-tuple: preferred_segments, group_ids (or None), dfs_replica_num
            cfg = cfg + (None,) * (8 - len(cfg)) + (dfs,)
        return cfg

    def _unbuffered(self, method):
        """True, with a warning, when this store was set up with local_buffer_size 0:
        Mooncake copies method's bytes through that buffer and refuses it."""
        if self._c is None or self._buffer_size:
            return False
        _log.warning("%s: refused: the store was set up with local_buffer_size 0, the "
                     "buffer Mooncake copies this call's bytes through", method)
        return True

    def _call(self, fn, fail):
        """Run fn(client); bad input -> fail(INVALID_PARAMS), kvpool.Error -> fail(code)."""
        try:
            return fn(self._client())
        except _kvpool.Error as e:
            st = getattr(e, "status", None)
            return fail(_code(st) if isinstance(st, int) and st < 0 else INTERNAL_ERROR)
        except _Refused as e:
            return fail(e.code)
        except _BAD_INPUT:
            return fail(INVALID_PARAMS)

    def _batch(self, keys, fn, conv):
        n = _n(keys)
        return self._call(lambda c: [conv(r) for r in fn(c)], lambda code: [code] * n)

    # ---- memory registration ----

    def register_buffer(self, buffer_ptr, size):
        """Register memory (host or CUDA) for transfers. 0 or negative."""
        def run(c):
            r = _code(c.register_buffer(buffer_ptr, size))
            if r == OK:
                with self._lock:
                    if self._c is c:
                        self._regs[buffer_ptr] = size
            return r
        return self._call(run, lambda x: x)

    def unregister_buffer(self, buffer_ptr):
        """Unregister memory registered with register_buffer. 0 or negative."""
        def run(c):
            r = _code(c.unregister_buffer(buffer_ptr))
            if r == OK:
                with self._lock:
                    self._regs.pop(buffer_ptr, None)
            return r
        return self._call(run, lambda x: x)

    def _capacity(self, ptr):
        """Bytes from ptr to the end of the registered buffer holding it, or None."""
        with self._lock:
            for base, size in self._regs.items():
                if base <= ptr < base + size:
                    return base + size - ptr
        return None

    # ---- existence ----

    def is_exist(self, key):
        """1 if the key exists, 0 if not, negative on error."""
        return self._call(lambda c: _code(c.is_exist(key)), lambda x: x)

    def batch_is_exist(self, keys):
        """[1 / 0 / negative] per key."""
        return self._batch(keys, lambda c: c.batch_exists(keys)[0], _code)

    # ---- puts ----

    def put(self, key, value, config=None):
        """Store bytes (or any buffer). 0 (also when the key exists) or negative
        (-600 with local_buffer_size 0)."""
        if self._unbuffered("put"):
            return INVALID_PARAMS
        return self._call(lambda c: _put_code(c.put(key, value, self._cfg(config))), lambda x: x)

    def put_from(self, key, buffer_ptr, size, config=None):
        """Store [buffer_ptr, +size) of host or CUDA memory. 0 (also when the key
        exists) or negative."""
        return self._call(lambda c: _put_code(c.put_from(key, buffer_ptr, size, self._cfg(config))),
                          lambda x: x)

    def put_parts(self, key, *parts, config=None):
        """One object from several 1-D byte buffers, concatenated in order. 0 or
        negative (-600 with local_buffer_size 0)."""
        if self._unbuffered("put_parts"):
            return INVALID_PARAMS
        return self._call(lambda c: _put_code(c.put_parts(key, parts, self._cfg(config))),
                          lambda x: x)

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """[0 / negative] per key, from (ptr, size) of host or CUDA memory."""
        return self._batch(keys, lambda c: c.batch_put_from(keys, buffer_ptrs, sizes,
                                                             self._cfg(config)), _put_code)

    def put_batch(self, keys, values, config=None):
        """Store several bytes values: 0 when all were stored, else the first error
        (-600 with local_buffer_size 0)."""
        if self._unbuffered("put_batch"):
            return INVALID_PARAMS
        res = self._batch(keys, lambda c: c.batch_put(keys, values, self._cfg(config)), _put_code)
        return next((r for r in res if r != 0), OK)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """[0 / negative] per key; key i is the concatenation of its buffers."""
        return self._batch(keys, lambda c: c.batch_put_multi(keys, all_buffer_ptrs,
                                                              all_sizes, self._cfg(config)),
                           _put_code)

    # ---- gets ----

    def get(self, key):
        """The object's bytes; b"" when it is missing (or on any error, or with
        local_buffer_size 0)."""
        if self._unbuffered("get"):
            return b""
        def run(c):
            r = c.get(key)
            return b"" if isinstance(r, int) else r
        return self._call(run, lambda code: b"")

    def get_into(self, key, buffer_ptr, size):
        """Bytes read into [ptr, ptr+size), or negative (-704 missing)."""
        return self._call(lambda c: _code(c.get_into_ptr(key, buffer_ptr, size)), lambda x: x)

    def get_size(self, key):
        """The object's size in bytes, or negative (-704 missing)."""
        return self._call(lambda c: _code(c.get_size(key)), lambda x: x)

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """[bytes read / negative] per key (-704 missing, -600 buffer too small)."""
        return self._batch(keys, lambda c: c.batch_get_into_ptrs(keys, buffer_ptrs, sizes), _code)

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """[bytes read / negative] per key, scattered over its buffers in order
        (-600 when they are too small, -704 missing)."""
        return self._batch(keys, lambda c: c.batch_get_into_multi(keys, all_buffer_ptrs,
                                                                   all_sizes), _code)

    def batch_get_buffer(self, keys):
        """[BufferHandle or None] per key: each object in memory of its own
        (buffer protocol, ptr(), size(), len()); None each with local_buffer_size 0."""
        if self._unbuffered("batch_get_buffer"):
            return [None] * _n(keys)
        def run(c):
            return [None if isinstance(h, int) else h for h in c.batch_get_buffer(keys)]
        return self._call(run, lambda code: [None] * _n(keys))

    def get_buffer(self, key):
        """One object as a BufferHandle, or None."""
        r = self.batch_get_buffer([key])
        return r[0] if r else None

    def get_batch(self, keys):
        """[bytes] per key, b"" for a missing one."""
        return [b"" if h is None else bytes(h) for h in self.batch_get_buffer(keys)]

    # ---- removal ----

    def remove(self, key, force=False):
        """Remove key. 0, or negative (-704 missing, -706 a reader holds a lease;
        force=True removes it anyway)."""
        return self._call(lambda c: _code(c.remove(key, bool(force))), lambda x: x)

    def remove_by_regex(self, regex_pattern, force=False):
        """Count of objects removed whose key matches regex_pattern, or negative."""
        return self._call(lambda c: _code(c.remove_by_regex(regex_pattern, bool(force))),
                          lambda x: x)

    def remove_all(self, force=False):
        """Count of objects removed, or negative."""
        return self._call(lambda c: _code(c.remove_all(bool(force))), lambda x: x)

    # ---- debug ----

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor]} for the keys that exist (debugging). Each
        descriptor answers is_memory_replica() / is_disk_replica() from the
        medium of the segment that holds it, and reads as a dict too
        ({"status", "size", "replica", "segment", "medium"})."""
        def run(c):
            media = _segments(c)
            own = [self._hostname] + [e for n, _, e in media.values() if n == self.get_hostname()]
            out = {}
            for k in keys:
                if not isinstance(k, str):
                    raise TypeError("keys must be str")
                info = _key_info(c, k)
                if info is None:
                    continue
                ids = info.get("segment_ids", [])
                out[k] = []
                for i in range(info["replicas"]):
                    name, medium, ep = media.get(ids[i], ("", "", "")) if i < len(ids) \
                        else ("", "", "")
                    out[k].append(ReplicaDescriptor(
                        "COMPLETE" if info["complete"] else "PROCESSING", info["size"], i,
                        name, medium, medium == "ssd" and any(_same_host(ep, h) for h in own)))
            return out
        return self._call(run, lambda code: {})

    def batch_replica_clear(self, keys, segment_name=""):
        """Mooncake's replica clear: the keys whose replicas were cleared, in the
        order asked ([] when the store is not set up or the master fails). With
        segment_name "" a key's object is removed as remove(key) removes it;
        with a segment name only its replicas on that segment go (the object
        stays readable from its others; removed whole when those were all it
        had). A key is skipped (not listed) when it is missing, has no replica
        on that segment, is being written or is under a read lease (a master
        started with --lease-on-put, as Mooncake's tests expect, leases an
        object just written for --lease-ttl). One difference from Mooncake,
        whose master records the writer: any store of the tenant with write
        rights may clear a key (Mooncake: only the client that put it)."""
        if isinstance(keys, (str, bytes)) or not all(isinstance(k, str) for k in keys):
            raise TypeError("batch_replica_clear(): keys must be a list of str")
        if not isinstance(segment_name, str):
            raise TypeError("batch_replica_clear(): segment_name must be str")
        if self._c is None:
            return []

        def run(c):
            todo = [k for k in dict.fromkeys(keys) if k]  # a key twice: cleared once
            cleared = []
            for lo in range(0, len(todo), _kvpool.MAX_BATCH):
                part = todo[lo:lo + _kvpool.MAX_BATCH]
                cleared += [k for k, r in zip(part, c.replica_clear(part, segment_name)) if r == 0]
            return cleared
        return self._call(run, lambda code: [])

    def get_replica_desc(self, key):
        """[ReplicaDescriptor] of key's replicas; [] when it is missing."""
        return self.batch_get_replica_desc([key]).get(key, []) if isinstance(key, str) else []

    # ---- copy and move tasks ----

    def create_copy_task(self, key, targets):
        """Copy key's object to the segments named in targets (1..8), in the
        background: (task id, 0), the id a pair of ints for query_task, or
        ((0, 0), negative code): -704 no such object, -600 a target not mounted
        (or on SSD, or draining). The owner of a replica writes the copies."""
        def run(c):
            if not isinstance(key, str) or isinstance(targets, str):
                raise TypeError("key must be str, targets a list of str")
            r = c.create_copy_task(key, list(targets))
            return ((0, 0), _code(r)) if isinstance(r, int) else (r, OK)
        return self._call(run, lambda code: ((0, 0), code))

    def create_move_task(self, key, source, target):
        """Move key's replica on segment source to segment target, in the
        background: (task id, 0), or ((0, 0), negative code) as create_copy_task
        (-600 also when source holds no replica or equals target)."""
        def run(c):
            r = c.create_move_task(key, source, target)
            return ((0, 0), _code(r)) if isinstance(r, int) else (r, OK)
        return self._call(run, lambda code: ((0, 0), code))

    def query_task(self, task_id):
        """(QueryTaskResponse, 0), or (None, negative code): -1400 TASK_NOT_FOUND
        when no task of this store's tenant has the id (the master keeps the 4096
        newest ended tasks); a task of a master that has since restarted or
        failed over answers TaskStatus.FAILED, saying so in its message."""
        def run(c):
            hi, lo = task_id
            r = c.query_task((hi, lo))
            if isinstance(r, int):
                return None, (codes.MOONCAKE["TASK_NOT_FOUND"] if r == _kvpool.ERR_NOT_FOUND
                              else _code(r))
            q = QueryTaskResponse()
            for name, v in (("id", (hi, lo)), ("type", TaskType(r["kind"])),
                            ("status", TaskStatus(r["status"])),
                            ("created_at_ms_epoch", r["created_ms"]),
                            ("last_updated_at_ms_epoch", r["updated_ms"]),
                            ("message", r["message"])):
                object.__setattr__(q, "_" + name, v)
            return q, OK
        return self._call(run, lambda code: (None, code))

    # ---- more of Mooncake's calls ----

    def batch_remove(self, keys, force=False):
        """[0 / negative] per key (-704 missing)."""
        return self._batch(keys, lambda c: c.batch_remove(keys, bool(force)), _code)

    def health_check(self):
        """Mooncake's codes: 0 healthy (the master answered), 1 not set up or
        closed, 2 the master unreachable."""
        c = self._c
        if c is None:
            return 1
        try:
            r = c.stat()
        except _kvpool.Error:
            return 2
        return 0 if isinstance(r, dict) else 2

    def upsert(self, key, value, config=None):
        """put, replacing the key's object if it exists. 0 or negative (-600 with
        local_buffer_size 0)."""
        if self._unbuffered("upsert"):
            return INVALID_PARAMS
        return self._call(lambda c: _code(c.put(key, value, self._write_cfg(config, True))),
                          lambda x: x)

    def upsert_from(self, key, buffer_ptr, size, config=None):
        """put_from, replacing an existing object. 0 or negative."""
        return self._call(lambda c: _code(c.put_from(key, buffer_ptr, size,
                                                     self._write_cfg(config, True))), lambda x: x)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        """batch_put_from, replacing existing objects. [0 / negative] per key."""
        return self._batch(keys, lambda c: c.batch_put_from(keys, buffer_ptrs, sizes,
                                                             self._write_cfg(config, True)), _code)

    def upsert_parts(self, key, *parts, config=None):
        """put_parts, replacing an existing object. 0 or negative (-600 with
        local_buffer_size 0)."""
        if self._unbuffered("upsert_parts"):
            return INVALID_PARAMS
        return self._call(lambda c: _code(c.put_parts(key, parts, self._write_cfg(config, True))),
                          lambda x: x)

    def upsert_batch(self, keys, values, config=None):
        """put_batch, replacing existing objects: 0, else the first error (-600
        with local_buffer_size 0)."""
        if self._unbuffered("upsert_batch"):
            return INVALID_PARAMS
        res = self._batch(keys, lambda c: c.batch_put(keys, values, self._write_cfg(config, True)),
                          _code)
        return next((r for r in res if r != 0), OK)

    def put_from_with_metadata(self, key, buffer_ptr, metadata_buffer_ptr, size, metadata_size,
                               config=None):
        """One object: [metadata_size bytes at metadata_buffer_ptr][size bytes at
        buffer_ptr], as Mooncake concatenates them. 0 or negative."""
        return self._call(lambda c: _put_code(c.batch_put_multi(
            [key], [[metadata_buffer_ptr, buffer_ptr]], [[metadata_size, size]],
            self._cfg(config))[0]), lambda x: x)

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Byte ranges of objects into buffers: for buffer i, key j of all_keys[i],
        range k: all_sizes[i][j][k] bytes from offset all_src_offsets[i][j][k] of
        the object to buffer_ptrs[i] + all_dst_offsets[i][j][k]. Returns bytes
        read / negative per range, nested as Mooncake nests them (one list per
        buffer, one per key, one entry per destination offset). As in Mooncake,
        lists of different lengths are -600 where they differ: the whole answer
        when the five top-level lists differ, one key's ranges when its three
        lists do (or one buffer's keys when its key and offset lists do), and
        the other ranges are still read. So is a range past the object's end
        (the bytes up to the end may have been written) and, in a buffer
        registered with register_buffer, a range past the registration's end
        (nothing written). Not CRC-checked (the stored CRC covers whole
        objects)."""
        def run(c):
            res = _ranges_shape(buffer_ptrs, all_keys, all_dst_offsets, INVALID_PARAMS)
            n = len(buffer_ptrs)
            if not n == len(all_keys) == len(all_dst_offsets) == len(all_src_offsets) \
                    == len(all_sizes):
                return res
            flat, where = [], []
            for i, keys in enumerate(all_keys):
                dsts, srcs, lens = all_dst_offsets[i], all_src_offsets[i], all_sizes[i]
                if not buffer_ptrs[i] or not len(keys) == len(dsts) == len(srcs) == len(lens):
                    continue
                cap = self._capacity(buffer_ptrs[i])
                for j, key in enumerate(keys):
                    if not len(dsts[j]) == len(srcs[j]) == len(lens[j]):
                        continue
                    for k, (d, s, z) in enumerate(zip(dsts[j], srcs[j], lens[j])):
                        if cap is not None and (d > cap or z > cap - d):
                            continue  # past the registered buffer: -600
                        flat.append((key, s, (buffer_ptrs[i] + d, z)))
                        where.append((i, j, k, z))
            got = []
            for lo in range(0, len(flat), _kvpool.MAX_BATCH):
                got += c.get_ranges(flat[lo:lo + _kvpool.MAX_BATCH])
            for (i, j, k, z), r in zip(where, got):
                # a range past the object's end reads short: Mooncake refuses it (-600)
                res[i][j][k] = INVALID_PARAMS if 0 <= r < z else _code(r)
            return res

        def fail(code):
            try:
                return _ranges_shape(buffer_ptrs, all_keys, all_dst_offsets, code)
            except _BAD_INPUT:
                return []
        return self._call(run, fail)

    # ---- transfer sessions (SGLang's layer-wise path) ----

    def batch_get_session_start(self, keys):
        """Look up each key's replicas and take its read lease once, for the ranged
        reads of batch_get_into_multi_buffer_ranges. [0 / negative] per key (-704
        missing); a failed start ends the key's session."""
        return self._batch(keys, lambda c: c.get_session_start(list(keys)), _code)

    def batch_get_into_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes,
                                           all_src_offsets):
        """Ranged reads with no master call: for key i, all_sizes[i][j] bytes of the
        object from all_src_offsets[i][j] into all_buffer_ptrs[i][j]. [bytes read /
        negative] per key: -600 with no get session (or after its end), a range past
        the object's size, or lists of different lengths (all keys when the four
        lists differ); -707 when the read lease ended (the session is dropped)."""
        return self._session_ranges(keys, all_buffer_ptrs, all_sizes, all_src_offsets,
                                    lambda c, *a: c.get_session_ranges(*a))

    def batch_get_session_end(self, keys):
        """Drop the keys' get sessions (their leases handed back). 0."""
        return self._call(lambda c: _code(c.get_session_end(list(keys))), lambda x: x)

    def batch_put_session_start(self, keys, sizes, config=None):
        """Reserve each object of sizes[i] bytes (invisible until the end). [0 /
        negative] per key: -600 for a key already in a put session, lists of
        different lengths, or group_ids of another length; -705 a key that exists."""
        n = _n(keys)
        if n != _n(sizes):
            return [INVALID_PARAMS] * n
        gids = getattr(config, "group_ids", None) if config is not None else None
        if gids is not None and _n(gids) != n:
            return [INVALID_PARAMS] * n
        return self._batch(keys, lambda c: c.put_session_start(list(keys), list(sizes),
                                                               self._cfg(config)), _code)

    def batch_put_from_multi_buffer_ranges(self, keys, all_buffer_ptrs, all_sizes,
                                           all_dst_offsets):
        """Ranged writes with no master call, into every replica, zero-copy: key i gets
        all_sizes[i][j] bytes from all_buffer_ptrs[i][j] at object offset
        all_dst_offsets[i][j]. [bytes written / negative] per key: -600 with no put
        session (or after its end or revoke), a range past the object's size, lists of
        different lengths; -500 past the master's put timeout."""
        return self._session_ranges(keys, all_buffer_ptrs, all_sizes, all_dst_offsets,
                                    lambda c, *a: c.put_session_ranges(*a))

    def batch_put_session_end(self, keys):
        """Make the objects visible. [0 / negative] per key: -600 with no put session,
        or bytes of the object never written (the session stays: write them, or
        revoke); -500 when the master dropped the put (its timeout)."""
        return self._batch(keys, lambda c: c.put_session_end(list(keys)), _code)

    def batch_put_session_revoke(self, keys):
        """Drop the puts: the keys stay absent. [0 / negative] per key (-600 with no put
        session)."""
        return self._batch(keys, lambda c: c.put_session_revoke(list(keys)), _code)

    def _session_ranges(self, keys, ptrs, sizes, offsets, call):
        """The range calls' shapes as Mooncake checks them: four lists of one length (else
        -600 for every key), each key's three lists of one length (else -600 for it)."""
        n = _n(keys)
        if not n == _n(ptrs) == _n(sizes) == _n(offsets):
            return [INVALID_PARAMS] * n

        def run(c):
            res = [INVALID_PARAMS] * n
            at = [i for i in range(n)
                  if 0 < _n(ptrs[i]) == _n(sizes[i]) == _n(offsets[i])]
            if at:
                got = call(c, [keys[i] for i in at], [list(ptrs[i]) for i in at],
                           [list(sizes[i]) for i in at], [list(offsets[i]) for i in at])
                for i, r in zip(at, got):
                    res[i] = _code(r)
            return res
        return self._call(run, lambda code: [code] * n)

    # ---- safetensors files ----

    def save_tensor_to_safetensor(self, key, file_name=None):
        """Write the tensor stored under key to a safetensors file named
        file_name (None: the key itself), holding one tensor named key. 0;
        -1100 FILE_NOT_FOUND when key holds no tensor; -600 when the store is
        not set up or the file cannot be written. The file is what
        safetensors.torch.save_file writes (Mooncake calls it), without needing
        that package."""
        if not isinstance(key, str):
            raise TypeError("save_tensor_to_safetensor(): key must be str")
        if self._c is None:
            return INVALID_PARAMS
        tensor = self.get_tensor(key)
        if tensor is None:
            return codes.MOONCAKE["FILE_NOT_FOUND"]
        if file_name is not None and not isinstance(file_name, str):
            raise RuntimeError("save_tensor_to_safetensor(): file_name must be str or None")
        try:
            _safetensors.save({key: tensor}, key if file_name is None else file_name)
        except (OSError, TypeError, ValueError):
            return INVALID_PARAMS
        return OK

    def load_tensor_from_safetensor(self, key=None, file_name=None):
        """Read a safetensors file and put_tensor one of its tensors: the one
        named key, else (with a warning, as Mooncake) the first in the file,
        stored under key (None: under file_name). Returns the tensor read, or
        None: the store not set up, no such file, not a safetensors file, no
        tensor in it, or the put failed."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() missing argument 'file_name'")
        if not isinstance(file_name, str):
            raise TypeError("load_tensor_from_safetensor(): file_name must be str")
        if self._c is None:
            return None
        try:
            loaded = _safetensors.load(file_name)
        except (OSError, ValueError):
            return None
        if not loaded:
            return None
        if key is not None and not isinstance(key, str):
            raise RuntimeError("load_tensor_from_safetensor(): key must be str or None")
        target = file_name if key is None else key
        name = next(iter(loaded))
        if key is not None:
            if key in loaded:
                name = key
            else:
                _log.warning("key %s not found in safetensor file %s; using its first "
                             "tensor, %s", key, file_name, name)
        tensor = loaded[name]
        return tensor if self.put_tensor(target, tensor) == OK else None

    def get_offload_rpc_read_count(self):
        """Reads Mooncake served over its offload RPC: kvpool has no such path
        (SSD replicas are read over the data transports), so always 0."""
        return 0


class MooncakeHostMemAllocator:
    """Mooncake's host memory allocator (its ShmHelper, process-wide): alloc(size) -> the
    address of size bytes of zeroed, page-aligned shared memory (MAP_SHARED), to register
    with a store and hand to the pointer calls; RuntimeError when it cannot be mapped.
    free(ptr) unmaps what alloc gave: 0, or -1 for an address it did not give (or gave and
    freed already)."""

    def alloc(self, size):
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 1 << 64:
            raise TypeError("alloc(): size must be an int in [0, 2^64)")
        try:
            m = _mmap.mmap(-1, size)
        except (OSError, ValueError, OverflowError) as e:
            raise RuntimeError(f"Failed to map shared memory of {size} bytes: {e}") from None
        probe = (_ctypes.c_char * 1).from_buffer(m)
        addr = _ctypes.addressof(probe)
        del probe  # (no export kept: free can unmap it)
        with _MEM_POOL_LOCK:
            _HOST_MEM[addr] = m
        return addr

    def free(self, ptr):
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise TypeError("free(): ptr must be an int")
        with _MEM_POOL_LOCK:
            m = _HOST_MEM.pop(ptr, None)
        if m is None:
            _log.error("MooncakeHostMemAllocator.free: %#x is no memory alloc gave", ptr)
            return -1
        m.close()
        return 0


def _segments(c):
    """{segment id: (name, medium, endpoint)} of the pool's segments."""
    st = c.stat()
    if not isinstance(st, dict):
        return {}
    return {g["id"]: (g["name"], g["medium"], g.get("endpoint", ""))
            for g in st.get("segments", [])}


def _loopback(host):
    return host == "localhost" or host == "::1" or host.startswith("127.")


def _same_host(a, b):
    """Whether two endpoints' or hostnames' hosts are one host as written (loopback names
    all one); no name is looked up."""
    ha, hb = _host_of(a), _host_of(b)
    if not ha or not hb:
        return False
    return ha.lower() == hb.lower() or (_loopback(ha) and _loopback(hb))


def _key_info(c, key):
    """list_keys' entry of exactly this key, or None when it is missing."""
    r = c.list_keys("^" + _re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", key) + "$", 1)
    return None if isinstance(r, int) or not r else r[0]


def _ranges_shape(buffer_ptrs, all_keys, all_dst_offsets, code):
    """get_into_ranges' answer filled with code, shaped as Mooncake shapes it
    (pyclient.h, build_ranged_read_results_like): a list per buffer, in it a
    list per key of all_keys[i] (one when all_keys has no row i), in that an
    entry per destination offset (one when there is no such row)."""
    out = []
    for i in range(len(buffer_ptrs)):
        rows = []
        for j in range(len(all_keys[i]) if i < len(all_keys) else 1):
            dst = (all_dst_offsets[i][j]
                   if i < len(all_dst_offsets) and j < len(all_dst_offsets[i]) else [0])
            rows.append([code] * len(dst))
        out.append(rows)
    return out


class ReplicaDescriptor(dict):
    """One replica of an object (get_replica_desc): Mooncake's
    is_memory_replica() / is_disk_replica() / is_local_disk_replica() and
    .status, from the medium of the segment holding it ("dram" or "ssd")."""

    def __init__(self, status, size, replica, segment, medium, local_disk=False):
        super().__init__(status=status, size=size, replica=replica, segment=segment,
                         medium=medium)
        self._local_disk = local_disk

    @property
    def status(self):
        return self["status"]

    def is_memory_replica(self):
        """True when the replica is in a DRAM segment."""
        return self["medium"] == "dram"

    def is_disk_replica(self):
        """True when the replica is on an SSD segment."""
        return self["medium"] == "ssd"

    def is_local_disk_replica(self):
        """True when the replica is on an SSD segment served from this store's own host
        (its local_hostname's, or its own segment's): Mooncake's local disk replica, the
        copy on the client's disk. An SSD segment elsewhere is is_disk_replica only."""
        return self._local_disk

    def get_memory_descriptor(self):
        """A memory replica's descriptor, as Mooncake's: .buffer_descriptor with
        transport_endpoint (the segment's name) and size. ValueError for a disk
        replica, as Mooncake's raises for the wrong kind."""
        if not self.is_memory_replica():
            raise ValueError("not a memory replica")
        return MemoryDescriptor(self["segment"], self["size"])


class _BufferDescriptor:
    """Mooncake's AllocatedBuffer::Descriptor as far as kvpool knows it: the
    segment that holds the replica (transport_endpoint) and its size."""

    __slots__ = ("transport_endpoint", "size")

    def __init__(self, endpoint, size):
        self.transport_endpoint = endpoint
        self.size = size

    def __repr__(self):
        return f"BufferDescriptor(transport_endpoint={self.transport_endpoint!r}, size={self.size})"


class MemoryDescriptor:
    """Mooncake's MemoryDescriptor: its buffer_descriptor."""

    __slots__ = ("buffer_descriptor",)

    def __init__(self, endpoint, size):
        self.buffer_descriptor = _BufferDescriptor(endpoint, size)


# Methods of Mooncake's MooncakeDistributedStore that kvpool does not provide, and why.
# Each raises NotImplementedError naming itself, never returns a made-up answer.
_UNSUPPORTED = {
    "unmount_local_disk_segment": "SSD segments are `kvpool serve --ssd-path`'s",
    "_get_pyclient_capsule": "Mooncake-internal",
}


def _unsupported(name, why):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"MooncakeDistributedStore.{name} is not supported by kvpool: "
                                  f"{why}")
    method.__name__ = name
    method.__qualname__ = f"MooncakeDistributedStore.{name}"
    method.__doc__ = f"Not supported by kvpool ({why}): raises NotImplementedError."
    return method


for _name, _why in _UNSUPPORTED.items():
    setattr(MooncakeDistributedStore, _name, _unsupported(_name, _why))
del _name, _why
