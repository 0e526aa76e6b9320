"""mooncake.store against Mooncake's binding at the snapshot kvpool follows:
the value types' names, members, numbers, defaults and exceptions
(docs/python.md)."""

import pytest

import mooncake.store as mstore
from mooncake.store import (ObjectDataType, ParallelAxis, QueryTaskResponse, ReadTarget,
                            ReplicaStatus, SoftPinAction, TaskStatus, TaskType,
                            TensorParallelism)


# ---- 1. the names ----

@pytest.mark.parametrize("enum, members", [
    (SoftPinAction, {"PRESERVE": 0, "ENABLE": 1, "DISABLE": 2}),
    (ObjectDataType, {"UNKNOWN": 0, "KVCACHE": 1, "TENSOR": 2, "WEIGHT": 3, "SAMPLE": 4,
                      "ACTIVATION": 5, "GRADIENT": 6, "OPTIMIZER_STATE": 7, "METADATA": 8,
                      "GENERAL": 9}),
    (ReplicaStatus, {"UNDEFINED": 0, "INITIALIZED": 1, "PROCESSING": 2, "COMPLETE": 3,
                     "REMOVED": 4, "FAILED": 5}),
    (TaskType, {"REPLICA_COPY": 0, "REPLICA_MOVE": 1}),
    (TaskStatus, {"PENDING": 0, "PROCESSING": 1, "FAILED": 2, "SUCCESS": 3}),
])
def test_enum_members_and_numbers(enum, members):
    assert {k: v.value for k, v in enum.__members__.items()} == members
    for name, number in members.items():
        m = getattr(enum, name)
        assert (m.name, m.value, int(m)) == (name, number, number)
        assert enum(number) is m
        assert m != number  # pybind11's scoped enums equal only their own members
        assert str(m) == f"{enum.__name__}.{name}"
        assert repr(m) == f"<{enum.__name__}.{name}: {number}>"
    assert len({hash(m) for m in enum}) == len(members)


def test_exported_values_as_mooncake_exports_them():
    # export_values() of ObjectDataType, ReplicaStatus, TaskType, TaskStatus in that order:
    # TaskStatus's PROCESSING and FAILED replace ReplicaStatus's; SoftPinAction is not exported
    assert mstore.KVCACHE is ObjectDataType.KVCACHE and mstore.GENERAL is ObjectDataType.GENERAL
    assert mstore.COMPLETE is ReplicaStatus.COMPLETE and mstore.REMOVED is ReplicaStatus.REMOVED
    assert mstore.PROCESSING is TaskStatus.PROCESSING and mstore.FAILED is TaskStatus.FAILED
    assert mstore.REPLICA_MOVE is TaskType.REPLICA_MOVE and mstore.SUCCESS is TaskStatus.SUCCESS
    assert not hasattr(mstore, "ENABLE") and not hasattr(mstore, "PRESERVE")
    for name in ("SoftPinAction", "QueryTaskResponse", "ObjectDataType", "ReplicaStatus",
                 "TaskType", "TaskStatus", "ParallelAxis", "TensorParallelism", "ReadTarget"):
        assert name in mstore.__all__ and getattr(mstore, name).__doc__


def test_query_task_response_defaults_read_only():
    r = QueryTaskResponse()
    assert (r.id, r.type, r.status, r.created_at_ms_epoch, r.last_updated_at_ms_epoch,
            r.assigned_client, r.message) == ((0, 0), TaskType.REPLICA_COPY, TaskStatus.PENDING,
                                              0, 0, (0, 0), "")
    assert repr(r) == ('QueryTaskResponse(id=0-0, type=0, status=0, created_at=0, '
                       'last_updated_at=0, assigned_client=0-0, message="")')
    for field in ("id", "type", "status", "message", "assigned_client"):
        with pytest.raises(AttributeError):
            setattr(r, field, getattr(r, field))
    with pytest.raises(TypeError):
        QueryTaskResponse(message="x")  # Mooncake's constructor takes nothing


def test_parallel_axis_tensor_parallelism_read_target():
    a = ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == \
        ("", 0, 1, None, None, None)
    a.kind, a.rank, a.size, a.split_dim = "tp", 3, 4, 1
    a.split_dim = None
    assert (a.kind, a.rank, a.size, a.split_dim) == ("tp", 3, 4, None)
    for field, bad in (("rank", 1 << 31), ("rank", 1.0), ("size", "2"), ("kind", None),
                       ("split_dim", -(1 << 31) - 1)):
        with pytest.raises(TypeError):
            setattr(a, field, bad)
    assert a.rank == 3
    with pytest.raises(AttributeError):
        a.no_such_field = 1

    t = TensorParallelism()
    assert t.axes == []
    t.axes = [a]
    t.axes.append(ParallelAxis())  # a copy, as pybind11 converts a std::vector each read
    assert len(t.axes) == 1 and t.axes[0] is a
    with pytest.raises(TypeError):
        t.axes = [1]

    r = ReadTarget()
    assert (r.mode, r.parallelism) == ("as_stored", None)
    for given, read in (("FULL", "full"), ("Shard", "shard"), ("as_stored", "as_stored")):
        r.mode = given
        assert r.mode == read
    with pytest.raises(RuntimeError, match="Unsupported ReadTarget mode"):
        r.mode = "rows"
    assert r.mode == "as_stored"
    r.parallelism = t
    assert r.parallelism is t
    r.parallelism = None
    with pytest.raises(TypeError):
        r.parallelism = [a]
