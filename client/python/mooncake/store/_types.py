"""Mooncake's small value types of mooncake.store, as its pybind11 binding has them.

Names, members, numbers, defaults and exceptions are those of Mooncake's
store_py.cpp (and the C++ types it binds: replica.h, types.h,
task_manager.h, rpc_types.h, store_py_internal.h):

- the enums (SoftPinAction, ObjectDataType, ReplicaStatus, TaskType,
  TaskStatus) behave as pybind11's scoped enums: `.name`, `.value`, `int()`,
  `__members__`, equal only to a member of their own type (never to an int);
- the structs (ReplicateConfig, QueryTaskResponse, ParallelAxis,
  TensorParallelism, ReadTarget) take only their fields, each converted as
  pybind11 converts it to its C++ type: a value the type cannot hold raises
  TypeError (-1 or 2**64 for an unsigned 64-bit field, an int for an enum), a
  list field reads back as a fresh copy, an unknown attribute raises
  AttributeError.

What kvpool does with each field is in docs/python.md ("ReplicateConfig").
"""

import enum as _enum

__all__ = ["SoftPinAction", "ObjectDataType", "ReplicaStatus", "TaskType", "TaskStatus",
           "ReplicateConfig", "QueryTaskResponse", "ParallelAxis", "TensorParallelism",
           "ReadTarget", "EXPORTED_VALUES"]

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


class _ScopedEnum(_enum.Enum):
    """A pybind11 py::enum_ of an enum class: int() and __index__ give the
    number; == holds only between members of the same enum."""

    def __int__(self):
        return self.value

    def __index__(self):
        return self.value

    def __hash__(self):
        return hash(self.value)


class SoftPinAction(_ScopedEnum):
    """What a put or upsert does to the object's soft pin (replica.h)."""
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(_ScopedEnum):
    """What kind of data an object holds (types.h)."""
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class ReplicaStatus(_ScopedEnum):
    """The state of one replica (replica.h)."""
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class TaskType(_ScopedEnum):
    """The kind of a replica task (task_manager.h)."""
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(_ScopedEnum):
    """The state of a replica task (task_manager.h: FAILED is 2, SUCCESS 3)."""
    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


# Mooncake's module calls export_values() on these, in this order: their members are
# also module attributes, a later enum's member replacing an earlier one's of the same
# name (mooncake.store.PROCESSING and .FAILED are TaskStatus's).
EXPORTED_VALUES = {}
for _e in (ObjectDataType, ReplicaStatus, TaskType, TaskStatus):
    EXPORTED_VALUES.update(_e.__members__)
del _e


# ---- pybind11's conversions, one per C++ field type ----

def _uint(v, bits=64):
    """size_t / uint64_t: an int (or __index__) in [0, 2**bits); else TypeError."""
    if isinstance(v, float) or isinstance(v, _ScopedEnum):
        raise TypeError(f"incompatible value {v!r}: an unsigned {bits}-bit integer is required")
    try:
        n = v.__index__()
    except (AttributeError, TypeError):
        raise TypeError(f"incompatible value {v!r}: an unsigned {bits}-bit integer is "
                        "required") from None
    if not 0 <= n < (1 << bits):
        raise TypeError(f"incompatible value {v!r}: out of range of an unsigned {bits}-bit "
                        "integer")
    return n


def _cint(v):
    """int (C's): an int in [-2**31, 2**31); else TypeError."""
    if isinstance(v, float) or isinstance(v, _ScopedEnum):
        raise TypeError(f"incompatible value {v!r}: an int is required")
    try:
        n = v.__index__()
    except (AttributeError, TypeError):
        raise TypeError(f"incompatible value {v!r}: an int is required") from None
    if not _INT_MIN <= n <= _INT_MAX:
        raise TypeError(f"incompatible value {v!r}: out of range of a C int")
    return n


def _opt(conv):
    return lambda v: None if v is None else conv(v)


def _bool(v):
    """bool: True/False, None (False), or anything with __bool__ (pybind11 converts)."""
    if v is True or v is False:
        return v
    if v is None:
        return False
    if hasattr(type(v), "__bool__"):
        return bool(v)
    raise TypeError(f"incompatible value {v!r}: a bool is required")


def _str(v):
    """std::string: str, or bytes (read back as str)."""
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    raise TypeError(f"incompatible value {v!r}: a str is required")


def _str_list(v):
    """std::vector<std::string>: a sequence (not a str) of str."""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or not hasattr(v, "__iter__"):
        raise TypeError(f"incompatible value {v!r}: a list of str is required")
    return [_str(x) for x in v]


def _of(cls):
    def conv(v):
        if not isinstance(v, cls):
            raise TypeError(f"incompatible value {v!r}: a {cls.__name__} is required")
        return v
    return conv


def _list_of(cls):
    def conv(v):
        if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
            raise TypeError(f"incompatible value {v!r}: a list of {cls.__name__} is required")
        return [_of(cls)(x) for x in v]
    return conv


def _copy(v):
    return list(v) if isinstance(v, list) else v


def _define(cls):
    """Give cls a property per FIELDS entry (reads copy lists, writes convert)."""
    for name, _default, conv in cls.FIELDS:
        def get(self, _n="_" + name):
            return _copy(object.__getattribute__(self, _n))

        def put(self, v, _n="_" + name, _c=conv):
            object.__setattr__(self, _n, _c(v))
        setattr(cls, name, property(get, put))
    return cls


class _Struct:
    """A pybind11 class_ with def_readwrite fields: FIELDS is ((name, default, conv), ...);
    a read of a list field returns a copy, as pybind11 converts a std::vector each time."""

    __slots__ = ()
    FIELDS = ()

    def __init__(self, **fields):
        # Mooncake's constructors take no arguments; keywords are kvpool's shorthand for
        # setting fields (an unknown one is a TypeError, as an unexpected keyword is).
        for name, default, _conv in self.FIELDS:
            object.__setattr__(self, "_" + name, _copy(default))
        names = {f[0] for f in self.FIELDS} | set(getattr(self, "ALIASES", ()))
        for k, v in fields.items():
            if k not in names:
                raise TypeError(f"{type(self).__name__}() got an unexpected keyword "
                                f"argument {k!r}")
            setattr(self, k, v)

    def _fields(self):
        return {name: getattr(self, name) for name, _d, _c in self.FIELDS}


@_define
class ReplicateConfig(_Struct):
    """Where and how a put's replicas go: Mooncake's fields and defaults
    (replica.h). Each is stored as Mooncake stores it; what kvpool does with
    each is in docs/python.md. `with_soft_pin` is the older Mooncake's
    boolean, kept as a view of soft_pin_action (True: ENABLE)."""

    __slots__ = ("_replica_num", "_nof_replica_num", "_dfs_replica_num", "_soft_pin_action",
                 "_soft_pin_ttl_ms", "_with_hard_pin", "_preferred_segments",
                 "_preferred_segment", "_preferred_nof_segments",
                 "_prefer_alloc_in_same_node", "_data_type", "_group_ids")
    FIELDS = (
        ("replica_num", 1, _uint),
        ("nof_replica_num", 0, _uint),
        ("dfs_replica_num", 0, _uint),
        ("soft_pin_action", SoftPinAction.PRESERVE, _of(SoftPinAction)),
        ("soft_pin_ttl_ms", None, _opt(_uint)),
        ("with_hard_pin", False, _bool),
        ("preferred_segments", [], _str_list),
        ("preferred_nof_segments", [], _str_list),
        ("preferred_segment", "", _str),
        ("prefer_alloc_in_same_node", False, _bool),
        ("data_type", ObjectDataType.UNKNOWN, _of(ObjectDataType)),
        ("group_ids", None, _opt(_str_list)),
    )
    ALIASES = ("with_soft_pin",)

    @property
    def with_soft_pin(self):
        """The older Mooncake's flag: soft_pin_action is ENABLE."""
        return self._soft_pin_action is SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, v):
        if _bool(v):
            self._soft_pin_action = SoftPinAction.ENABLE
        elif self._soft_pin_action is SoftPinAction.ENABLE:
            self._soft_pin_action = SoftPinAction.PRESERVE

    def __str__(self):
        # replica.h's operator<<: bools as 1/0, an unset TTL as "default"
        f = self._fields()
        s = (f"ReplicateConfig: {{ replica_num: {f['replica_num']}, "
             f"nof_replica_num: {f['nof_replica_num']}, "
             f"dfs_replica_num: {f['dfs_replica_num']}, "
             f"soft_pin_action: {f['soft_pin_action'].name}, soft_pin_ttl_ms: "
             f"{'default' if f['soft_pin_ttl_ms'] is None else f['soft_pin_ttl_ms']}, "
             f"with_hard_pin: {int(f['with_hard_pin'])}, "
             f"preferred_segments: [{', '.join(f['preferred_segments'])}]")
        if f["preferred_segment"]:
            s += f", preferred_segment (deprecated): {f['preferred_segment']}"
        s += (f", preferred_nof_segments: [{', '.join(f['preferred_nof_segments'])}]"
              f", prefer_alloc_in_same_node: {int(f['prefer_alloc_in_same_node'])}"
              f", data_type: {f['data_type'].name}")
        if f["group_ids"] is not None:
            s += f", group_ids: [{', '.join(f['group_ids'])}]"
        return s + " }"

    def __repr__(self):
        return "ReplicateConfig(" + ", ".join(f"{k}={v!r}" for k, v in self._fields().items()) \
            + ")"


def _any(v):
    return v


@_define
class QueryTaskResponse(_Struct):
    """query_task's answer (rpc_types.h); its fields are read-only in Mooncake,
    and a default one is all zeros: id and assigned_client (0, 0), REPLICA_COPY,
    PENDING, times 0, message ""."""

    __slots__ = ("_id", "_type", "_status", "_created_at_ms_epoch",
                 "_last_updated_at_ms_epoch", "_assigned_client", "_message")
    FIELDS = (
        ("id", (0, 0), _any),
        ("type", TaskType.REPLICA_COPY, _of(TaskType)),
        ("status", TaskStatus.PENDING, _of(TaskStatus)),
        ("created_at_ms_epoch", 0, _any),
        ("last_updated_at_ms_epoch", 0, _any),
        ("assigned_client", (0, 0), _any),
        ("message", "", _str),
    )

    def __init__(self):
        super().__init__()

    def __repr__(self):
        f = self._fields()
        return (f"QueryTaskResponse(id={f['id'][0]}-{f['id'][1]}, type={f['type'].value}, "
                f"status={f['status'].value}, created_at={f['created_at_ms_epoch']}, "
                f"last_updated_at={f['last_updated_at_ms_epoch']}, "
                f"assigned_client={f['assigned_client'][0]}-{f['assigned_client'][1]}, "
                f"message=\"{f['message']}\")")


def _read_only(cls):
    for name, _d, _c in cls.FIELDS:
        def get(self, _n="_" + name):
            return object.__getattribute__(self, _n)
        setattr(cls, name, property(get))
    return cls


_read_only(QueryTaskResponse)


@_define
class ParallelAxis(_Struct):
    """One axis of a tensor's parallel layout (store_py_internal.h's
    ParallelAxisSpec): kind "", rank 0, size 1, split_dim / expert_id /
    stage_id None."""

    __slots__ = ("_kind", "_rank", "_size", "_split_dim", "_expert_id", "_stage_id")
    FIELDS = (
        ("kind", "", _str),
        ("rank", 0, _cint),
        ("size", 1, _cint),
        ("split_dim", None, _opt(_cint)),
        ("expert_id", None, _opt(_cint)),
        ("stage_id", None, _opt(_cint)),
    )


@_define
class TensorParallelism(_Struct):
    """A tensor's parallel layout: axes, a list of ParallelAxis (empty)."""

    __slots__ = ("_axes",)
    FIELDS = (("axes", [], _list_of(ParallelAxis)),)


_READ_TARGET_MODES = {"AS_STORED": "as_stored", "SHARD": "shard", "FULL": "full"}


def _read_target_mode(v):
    if not isinstance(v, str):
        raise TypeError(f"incompatible value {v!r}: a str is required")
    mode = _READ_TARGET_MODES.get(v.upper())
    if mode is None:
        raise RuntimeError("Unsupported ReadTarget mode")
    return mode


@_define
class ReadTarget(_Struct):
    """What a parallel read returns: mode "as_stored" (default), "shard" or
    "full" (any case; another raises RuntimeError), and parallelism, a
    TensorParallelism or None."""

    __slots__ = ("_mode", "_parallelism")
    FIELDS = (
        ("mode", "as_stored", _read_target_mode),
        ("parallelism", None, _opt(_of(TensorParallelism))),
    )
