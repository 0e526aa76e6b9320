"""kvpool status -> Mooncake ErrorCode: the one table mooncake.store returns by.

Mooncake's numbers are those of mooncake-store/include/types.h, which the
connectors compare against (0 OK, -200 NO_AVAILABLE_HANDLE makes vLLM pause
its stores, -704 OBJECT_NOT_FOUND, -600 INVALID_PARAMS, ...). docs/python.md
has this table with the reasons.
"""

import kvpool

#: Mooncake ErrorCode names and numbers (types.h)
MOONCAKE = {
    "OK": 0, "INTERNAL_ERROR": -1, "BUFFER_OVERFLOW": -10, "SEGMENT_NOT_FOUND": -101,
    "SEGMENT_ALREADY_EXISTS": -102, "CLIENT_NOT_FOUND": -103, "NO_AVAILABLE_HANDLE": -200,
    "INVALID_VERSION": -300, "INVALID_KEY": -400, "WRITE_FAIL": -500, "INVALID_PARAMS": -600,
    "ILLEGAL_CLIENT": -601, "INVALID_WRITE": -700, "INVALID_READ": -701, "INVALID_REPLICA": -702,
    "REPLICA_IS_NOT_READY": -703, "OBJECT_NOT_FOUND": -704, "OBJECT_ALREADY_EXISTS": -705,
    "OBJECT_HAS_LEASE": -706, "LEASE_EXPIRED": -707, "REPLICA_NOT_FOUND": -710,
    "REPLICA_IS_GONE": -712, "OBJECT_REPLICA_BUSY": -714, "TRANSFER_FAIL": -800,
    "CHECKSUM_MISMATCH": -801, "RPC_FAIL": -900, "RPC_TIMEOUT": -901,
    "ETCD_OPERATION_ERROR": -1000, "NOT_SUPPORTED": -1012, "FILE_READ_FAIL": -1102,
    "FILE_WRITE_FAIL": -1103, "UNABLE_OFFLOAD": -1300, "TENANT_QUOTA_EXCEEDED": -1700,
}

#: every kvpool status -> the Mooncake ErrorCode name mooncake.store returns for it
KVP_TO_MOONCAKE_NAME = {
    "KVP_OK": "OK",
    "KVP_ERR_INVALID_ARG": "INVALID_PARAMS",
    "KVP_ERR_NOMEM": "INTERNAL_ERROR",
    "KVP_ERR_NOT_FOUND": "OBJECT_NOT_FOUND",
    "KVP_ERR_EXISTS": "OBJECT_ALREADY_EXISTS",  # puts return 0 for it (PUT_OK)
    "KVP_ERR_POOL_FULL": "NO_AVAILABLE_HANDLE",
    "KVP_ERR_TOO_LARGE": "NO_AVAILABLE_HANDLE",  # no segment can hold it: no space for it
    "KVP_ERR_NO_SEGMENT": "NO_AVAILABLE_HANDLE",  # no memory mounted at all
    "KVP_ERR_BUFFER_TOO_SMALL": "INVALID_PARAMS",  # Mooncake: buffers too small -> -600
    "KVP_ERR_CHECKSUM": "CHECKSUM_MISMATCH",
    "KVP_ERR_BAD_KEY": "INVALID_PARAMS",
    "KVP_ERR_PENDING": "REPLICA_IS_NOT_READY",  # puts return 0 for it (PUT_OK)
    "KVP_ERR_NOT_PENDING": "INTERNAL_ERROR",
    "KVP_ERR_CONNECT": "RPC_FAIL",
    "KVP_ERR_IO": "TRANSFER_FAIL",
    "KVP_ERR_TIMEOUT": "RPC_TIMEOUT",
    "KVP_ERR_PROTOCOL": "RPC_FAIL",
    "KVP_ERR_VERSION": "RPC_FAIL",
    "KVP_ERR_FRAME_TOO_LARGE": "RPC_FAIL",
    "KVP_ERR_SEGMENT_GONE": "SEGMENT_NOT_FOUND",
    "KVP_ERR_OUT_OF_RANGE": "INVALID_PARAMS",
    "KVP_ERR_TRANSPORT": "TRANSFER_FAIL",
    "KVP_ERR_UNKNOWN_METHOD": "NOT_SUPPORTED",
    "KVP_ERR_TOO_MANY": "INVALID_PARAMS",
    "KVP_ERR_SYSTEM": "INTERNAL_ERROR",
    "KVP_ERR_SHUTDOWN": "INTERNAL_ERROR",
    "KVP_ERR_NOT_OWNER": "ILLEGAL_CLIENT",
    "KVP_ERR_INTERNAL": "INTERNAL_ERROR",
    "KVP_ERR_LEASED": "OBJECT_HAS_LEASE",
    "KVP_ERR_LEASE_EXPIRED": "LEASE_EXPIRED",
    "KVP_ERR_POOL_BUSY": "NO_AVAILABLE_HANDLE",  # full for now: callers back off, as on -200
    "KVP_ERR_NO_REPLICA": "REPLICA_NOT_FOUND",
    "KVP_ERR_UNKNOWN_SEGMENT": "SEGMENT_NOT_FOUND",
    "KVP_ERR_PUT_REVOKED": "WRITE_FAIL",
    "KVP_ERR_IN_USE": "OBJECT_REPLICA_BUSY",
    "KVP_ERR_UNSUPPORTED": "NOT_SUPPORTED",
    "KVP_ERR_NO_SPACE": "FILE_WRITE_FAIL",
    "KVP_ERR_NOT_LEADER": "RPC_FAIL",
    "KVP_ERR_DENIED": "ILLEGAL_CLIENT",
    "KVP_ERR_QUOTA": "NO_AVAILABLE_HANDLE",  # the tenant is full: callers back off, as on -200
}

#: kvpool status number -> Mooncake ErrorCode number
KVP_TO_MOONCAKE = {kvpool.STATUS[k]: MOONCAKE[v] for k, v in KVP_TO_MOONCAKE_NAME.items()}

OK = 0
INTERNAL_ERROR = MOONCAKE["INTERNAL_ERROR"]
INVALID_PARAMS = MOONCAKE["INVALID_PARAMS"]
OBJECT_NOT_FOUND = MOONCAKE["OBJECT_NOT_FOUND"]
NO_AVAILABLE_HANDLE = MOONCAKE["NO_AVAILABLE_HANDLE"]


def to_mooncake(status):
    """A kvpool status (or size, >= 0, returned as is) as Mooncake's code."""
    if status >= 0:
        return status
    return KVP_TO_MOONCAKE.get(status, INTERNAL_ERROR)
