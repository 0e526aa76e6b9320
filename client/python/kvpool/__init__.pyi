"""Type stubs of the kvpool package (docs/python.md). The implementation is
kvpool/__init__.py over the C extension kvpool._kvpool."""

from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

__version__: str

#: a buffer: any object with the buffer protocol (C-contiguous; writable for gets), or an
#: (address, size) pair of ints (host or CUDA memory, e.g. (t.data_ptr(), t.nbytes))
Buffer = Union[bytes, bytearray, memoryview, Any, Tuple[int, int]]
Size = Union[int, str]

STATUS: Dict[str, int]
STATUS_NAMES: Dict[int, str]
OK: int
ERR_BAD_KEY: int
ERR_BUFFER_TOO_SMALL: int
ERR_CHECKSUM: int
ERR_CONNECT: int
ERR_DENIED: int
ERR_EXISTS: int
ERR_FRAME_TOO_LARGE: int
ERR_INTERNAL: int
ERR_INVALID_ARG: int
ERR_IN_USE: int
ERR_IO: int
ERR_LEASED: int
ERR_LEASE_EXPIRED: int
ERR_NOMEM: int
ERR_NOT_FOUND: int
ERR_NOT_LEADER: int
ERR_NOT_OWNER: int
ERR_NOT_PENDING: int
ERR_NO_REPLICA: int
ERR_NO_SEGMENT: int
ERR_NO_SPACE: int
ERR_OUT_OF_RANGE: int
ERR_PENDING: int
ERR_POOL_BUSY: int
ERR_POOL_FULL: int
ERR_PROTOCOL: int
ERR_PUT_REVOKED: int
ERR_QUOTA: int
ERR_SEGMENT_GONE: int
ERR_SHUTDOWN: int
ERR_SYSTEM: int
ERR_TIMEOUT: int
ERR_TOO_LARGE: int
ERR_TOO_MANY: int
ERR_TRANSPORT: int
ERR_UNKNOWN_METHOD: int
ERR_UNKNOWN_SEGMENT: int
ERR_UNSUPPORTED: int
ERR_VERSION: int
PIN_NONE: int
PIN_SOFT: int
PIN_HARD: int
COPY_TASK: int
MOVE_TASK: int
TASK_PENDING: int
TASK_PROCESSING: int
TASK_FAILED: int
TASK_SUCCESS: int
PUT_INSERT: int
PUT_UPSERT: int
SEGMENT_LOCAL: str
MAX_BATCH: int


class Error(Exception):
    """A failed call: .status (kvp_status_t, negative), .name ("KVP_ERR_NOT_FOUND")."""

    status: int
    name: str


class BufferHandle:
    """An object read into page-aligned memory of its own (buffer protocol, writable)."""

    def ptr(self) -> int: ...
    def size(self) -> int: ...
    def __len__(self) -> int: ...


def parse_size(value: Size) -> int: ...


class Client:
    """A connection to a kvpool master, optionally contributing memory."""

    def __init__(self, master: Optional[str] = ..., segment_size: Size = ...,
                 transport: Optional[str] = ..., rpc_timeout_ms: int = ..., *,
                 data_host: Optional[str] = ..., segment_name: Optional[str] = ...,
                 rdma_devices: Optional[str] = ..., verify_crc: bool = ...,
                 tcp_streams: int = ..., tls_cert: Optional[str] = ...,
                 tls_key: Optional[str] = ..., tls_ca: Optional[str] = ...,
                 token: Optional[str] = ..., segment_tenant: Optional[str] = ...,
                 segment_file: Optional[str] = ..., segment_file_offset: Size = ...,
                 dfs_path: Optional[str] = ...) -> None: ...
    def close(self) -> None: ...
    def drain(self, timeout_s: float = ...) -> Tuple[int, int]: ...
    def __enter__(self) -> "Client": ...
    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def segment_name(self) -> Optional[str]: ...
    @property
    def raw(self) -> Any: ...

    def put(self, key: str, data: Buffer, *, replicas: int = ...,
            preferred_segment: Union[None, str, Sequence[str]] = ..., pin: Union[int, str] = ...,
            soft_pin_ttl_s: int = ..., upsert: bool = ..., medium: Optional[str] = ...,
            dfs_replica_num: int = ...) -> None: ...
    def put_from(self, key: str, ptr: int, size: int, **config: Any) -> None: ...
    def get(self, key: str) -> bytes: ...
    def get_into(self, key: str, buffer: Buffer) -> int: ...
    def size(self, key: str) -> int: ...
    def exists(self, key: str) -> bool: ...
    def remove(self, key: str, force: bool = ...) -> None: ...
    def remove_all(self, force: bool = ...) -> int: ...
    def remove_by_regex(self, pattern: str, force: bool = ...) -> int: ...

    def batch_put(self, keys: Sequence[str], buffers: Sequence[Buffer], *, replicas: int = ...,
                  preferred_segment: Union[None, str, Sequence[str]] = ..., pin: Union[int, str] = ...,
                  soft_pin_ttl_s: int = ..., upsert: bool = ...,
                  medium: Optional[str] = ..., dfs_replica_num: int = ...) -> List[int]: ...
    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Buffer]) -> List[int]: ...
    def batch_put_multi(self, keys: Sequence[str], buffers: Sequence[Sequence[Buffer]],
                        **config: Any) -> List[int]: ...
    def batch_get_into_multi(self, keys: Sequence[str],
                             buffers: Sequence[Sequence[Buffer]]) -> List[int]: ...
    def batch_exists(self, keys: Sequence[str]) -> List[bool]: ...
    def cached_prefix(self, keys: Sequence[str]) -> int: ...
    def batch_remove(self, keys: Sequence[str], force: bool = ...) -> List[int]: ...
    def batch_get(self, keys: Sequence[str]) -> List[Optional[bytes]]: ...
    def get_ranges(self, ranges: Sequence[Tuple[str, int, Buffer]]) -> List[int]: ...

    def register_buffer(self, buffer: Union[Buffer, int], size: Optional[int] = ...) -> None: ...
    def unregister_buffer(self, buffer: Union[Buffer, int]) -> None: ...

    def stat(self) -> Dict[str, Any]: ...
    def metrics(self) -> Dict[str, Any]: ...
    def metrics_text(self) -> str: ...
    def list_keys(self, pattern: Optional[str] = ..., max: int = ...) -> List[Dict[str, Any]]: ...
    def copy_task(self, key: str, targets: Sequence[str]) -> Tuple[int, int]: ...
    def move_task(self, key: str, source: str, target: str) -> Tuple[int, int]: ...
    def query_task(self, task_id: Tuple[int, int]) -> Dict[str, Any]: ...
    def wait_task(self, task_id: Tuple[int, int], timeout_s: float = ...) -> Dict[str, Any]: ...

    async def aget(self, key: str) -> bytes: ...
    async def aget_into(self, key: str, buffer: Buffer) -> int: ...
    async def aput(self, key: str, data: Buffer, **config: Any) -> None: ...
    async def aexists(self, key: str) -> bool: ...
    async def abatch_put(self, keys: Sequence[str], buffers: Sequence[Buffer],
                         **config: Any) -> List[int]: ...
    async def abatch_get_into(self, keys: Sequence[str],
                              buffers: Sequence[Buffer]) -> List[int]: ...
    async def abatch_exists(self, keys: Sequence[str]) -> List[bool]: ...
