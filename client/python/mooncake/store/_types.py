"""Mooncake's small value types of mooncake.store, as its pybind11 binding has them.

Names, members, numbers, defaults and exceptions are those of Mooncake's
store_py.cpp (and the C++ types it binds: replica.h, types.h,
task_manager.h, rpc_types.h, store_py_internal.h):

- the enums (SoftPinAction, ObjectDataType, ReplicaStatus, TaskType,
  TaskStatus) behave as pybind11's scoped enums: `.name`, `.value`, `int()`,
  `__members__`, equal only to a member of their own type (never to an int);
- the structs (QueryTaskResponse, ParallelAxis, TensorParallelism,
  ReadTarget) take only their fields, each converted as
  pybind11 converts it to its C++ type: a value the type cannot hold raises
  TypeError (an int out of a C int's range, an int for an enum), a list
  field reads back as a fresh copy, an unknown attribute raises
  AttributeError.
"""

import enum as _enum

__all__ = ["SoftPinAction", "ObjectDataType", "ReplicaStatus", "TaskType", "TaskStatus",
           "QueryTaskResponse", "ParallelAxis", "TensorParallelism",
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


def _str(v):
    """std::string: str, or bytes (read back as str)."""
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    raise TypeError(f"incompatible value {v!r}: a str is required")


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

    @classmethod
    def _make(cls, **fields):
        """kvpool's constructor of a filled answer (the fields stay read-only)."""
        r = cls()
        for name, _d, conv in cls.FIELDS:
            if name in fields:
                object.__setattr__(r, "_" + name, conv(fields[name]))
        return r

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
