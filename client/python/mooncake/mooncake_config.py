"""mooncake.mooncake_config on kvpool: Mooncake's MooncakeConfig, written for kvpool.

The same names, fields, defaults, parsing and errors as the module of that
name in Mooncake's wheel, so code (and Mooncake's tests) that builds a store's
setup() arguments with it runs unchanged:

    cfg = MooncakeConfig.load_from_env()      # MOONCAKE_CONFIG_PATH, or MOONCAKE_* variables
    store.setup(cfg.local_hostname, cfg.metadata_server, cfg.global_segment_size,
                cfg.local_buffer_size, cfg.protocol, cfg.device_name,
                cfg.master_server_address)

On kvpool, master_server_address is the kvpool master and global_segment_size
the memory the store contributes; metadata_server, local_buffer_size and the
SSD / tenant / HTTP fields are carried to setup(), which accepts them
(docs/python.md, "Pointing an existing connector at kvpool").
"""

import dataclasses
import json
import logging
import os
from typing import Optional

__all__ = ["MooncakeConfig", "DEFAULT_GLOBAL_SEGMENT_SIZE", "DEFAULT_LOCAL_BUFFER_SIZE"]

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB, Mooncake's default
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB

# Suffixes are tried in this order, so "kb" wins over "b" and "k" (binary units).
_UNITS = (("kb", 1 << 10), ("mb", 1 << 20), ("gb", 1 << 30), ("tb", 1 << 40),
          ("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40), ("b", 1))

# The protocols Mooncake's engine and store know; another one is passed on with a
# warning (the engine decides), never refused here.
_KNOWN_PROTOCOLS = frozenset((
    "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex", "cxl",
    "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only"))

_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")

_TRUE = ("true", "1", "yes", "on", "enable")
_FALSE = ("false", "0", "no", "off", "disable")


def _parse_segment_size(value) -> int:
    """An int as is; a string as a number with an optional binary unit
    ("4gb", "512 MB", "1.5g", "100"); anything else through int()."""
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return int(value)
    text = value.strip().lower()
    if not text:
        raise ValueError("Invalid segment size: empty string")
    for unit, scale in _UNITS:
        if text.endswith(unit):
            number = text[:-len(unit)].strip()
            if not number:
                raise ValueError(f"Invalid segment size: missing number before '{unit}'")
            return int(float(number) * scale)
    return int(float(text))


def _parse_bool(value) -> bool:
    """A bool from a bool, a number, None (False) or text (true/false, yes/no,
    on/off, 1/0, enable/disable, any case; empty is False); other text raises
    ValueError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    text = str(value).strip().lower()
    if not text or text in _FALSE:
        return False
    if text in _TRUE:
        return True
    raise ValueError(f"Invalid boolean value: {value!r}")


@dataclasses.dataclass
class MooncakeConfig:
    """A store's setup() arguments (Mooncake's fields and defaults).

    The protocol is stripped and lowercased (an unknown one is logged and kept),
    sizes must be >= 0, and local_hostname, metadata_server and
    master_server_address must be non-empty strings: ValueError otherwise.
    """

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self):
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"Invalid protocol: {self.protocol!r}. Protocol must be a "
                             "non-empty string, e.g. 'tcp' or 'rdma'.")
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in _KNOWN_PROTOCOLS:
            logger.warning("Unrecognised protocol %r; passing it through unchanged. Known "
                           "protocols are: %s.", self.protocol,
                           ", ".join(sorted(_KNOWN_PROTOCOLS)))
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"Invalid {name}: {getattr(self, name)}. "
                                 "Size must be non-negative.")
        for name in _REQUIRED:
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"Config field {name!r} must be a non-empty string, "
                                 f"got {v!r}.")

    @staticmethod
    def from_file(file_path: str) -> "MooncakeConfig":
        """A config from a JSON file; local_hostname, metadata_server and
        master_server_address must be there (ValueError)."""
        with open(file_path) as f:
            doc = json.load(f)
        for name in _REQUIRED:
            if name not in doc:
                raise ValueError(f"Missing required config field: {name}")
        ssd_path, tenant = doc.get("ssd_offload_path"), doc.get("tenant_id")
        return MooncakeConfig(
            local_hostname=doc.get("local_hostname"),
            metadata_server=doc.get("metadata_server"),
            global_segment_size=_parse_segment_size(
                doc.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_parse_segment_size(
                doc.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=doc.get("protocol", "tcp"),
            device_name=doc.get("device_name", ""),
            master_server_address=doc.get("master_server_address"),
            enable_ssd_offload=_parse_bool(doc.get("enable_ssd_offload", False)),
            ssd_offload_path="" if ssd_path is None else str(ssd_path),
            tenant_id="default" if tenant is None else str(tenant),
            enable_client_http_server=_parse_bool(doc.get("enable_client_http_server", False)),
            client_http_port=int(doc.get("client_http_port", 9300)),
        )

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        """The file $MOONCAKE_CONFIG_PATH names; without it, the MOONCAKE_*
        variables (MOONCAKE_MASTER required, else ValueError):
        MOONCAKE_LOCAL_HOSTNAME (localhost), MOONCAKE_TE_META_DATA_SERVER
        (P2PHANDSHAKE), MOONCAKE_GLOBAL_SEGMENT_SIZE, MOONCAKE_LOCAL_BUFFER_SIZE,
        MOONCAKE_PROTOCOL (tcp), MOONCAKE_DEVICE, MOONCAKE_OFFLOAD_ENABLED,
        MOONCAKE_OFFLOAD_FILE_STORAGE_PATH, MOONCAKE_TENANT_ID,
        MOONCAKE_ENABLE_CLIENT_HTTP_SERVER, MOONCAKE_CLIENT_HTTP_PORT (9300)."""
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        if not os.getenv("MOONCAKE_MASTER"):
            raise ValueError("Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor "
                             "'MOONCAKE_MASTER' is set.")
        env = os.getenv
        return MooncakeConfig(
            local_hostname=env("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=_parse_segment_size(
                env("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_parse_segment_size(
                env("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=env("MOONCAKE_PROTOCOL", "tcp"),
            device_name=env("MOONCAKE_DEVICE", ""),
            master_server_address=env("MOONCAKE_MASTER"),
            enable_ssd_offload=_parse_bool(env("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=env("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=env("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=_parse_bool(
                env("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")),
            client_http_port=int(env("MOONCAKE_CLIENT_HTTP_PORT", 9300)),
        )
