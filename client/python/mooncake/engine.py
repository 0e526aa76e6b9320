"""mooncake.engine: Mooncake's TransferEngine on kvpool's transports.

What vLLM's MooncakeConnector calls (``initialize(hostname, "P2PHANDSHAKE",
protocol, device)``, ``get_rpc_port()``, ``batch_register_memory``,
``batch_transfer_sync_write("host:port", ...)``) with Mooncake's signatures and
return codes (0 on success, -1 on failure; batch ids 0 on failure), on
libkvpool's transfer engine (kvpool_te.h, docs/architecture.md "Transfer
engine"): the memory a process registers is served on its rpc port, peers
write and read it by virtual address over tcp, on one host a Unix socket
(protocol "shm"), or one-sided rdma into its registered regions (protocol
"rdma"); "auto" picks per peer. A range the target did not register
is refused by the target; protected mode (KVPOOL_AUTH, default) takes peers
of this host only.

Beyond Mooncake: ``last_status`` holds the last call's kvpool status (a
``kvpool.STATUS`` value: -20 KVP_ERR_OUT_OF_RANGE, -13 KVP_ERR_CONNECT, ...),
``metrics()`` the engine's counters.

The ``_on_cuda`` forms wait for the caller's CUDA stream, then move device
memory through the library's GPU path (staged in reused pinned host buffers);
they return once the bytes moved and raise RuntimeError on failure (Mooncake
runs them from a host function on the stream and ends the process on failure).

Not in this version (each raises NotImplementedError naming itself):
``get_local_topology``, ``warmup_efa_segment``, ``get_engine_ptr``.
"""

import ctypes
import enum
import logging
import mmap
import os

from kvpool import _kvpool

from mooncake._rpc import (CoroRPCInterface, ReceivedData, ReceivedTensor, RpcInterface,
                           create_rpc_client, create_rpc_server)

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode", "InnerTransferEngine",
           "RpcInterface", "CoroRPCInterface", "ReceivedData", "ReceivedTensor",
           "create_rpc_client", "create_rpc_server"]

_log = logging.getLogger("mooncake.engine")

def _cuda_driver():
    """Whether a CUDA driver library loads (what libkvpool's GPU path opens: $KVPOOL_CUDA_LIB,
    else libcuda.so.1): Mooncake's SUPPORT_CUDA, the `_on_cuda` forms can run."""
    try:
        ctypes.CDLL(os.environ.get("KVPOOL_CUDA_LIB") or "libcuda.so.1")
    except OSError:
        return False
    return True


SUPPORT_CUDA = _cuda_driver()
# Mooncake's other build flags: transports and devices kvpool's engine has none of (AWS EFA,
# AMD HIP, multi-node NVLink, Moore Threads MUSA, intra-node NVLink)
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False


class TransferOpcode(enum.IntEnum):
    """Mooncake's TransferOpcode (pybind11 names Read/Write, exported to the module as Read and
    Write; READ/WRITE are kvpool's aliases)."""

    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


# pybind11's export_values(): the opcodes as module attributes too
Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """Mooncake's TransferNotify(name, msg)."""

    def __init__(self, name="", msg=""):
        self.name = name
        self.msg = msg

    def __repr__(self):
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


class InnerTransferEngine:
    """What ``get_engine()`` hands out: the engine, for code that passes it around."""

    def __init__(self, outer):
        self._outer = outer


def _unsupported(name, why):
    raise NotImplementedError(f"TransferEngine.{name} is not supported by kvpool yet: {why}")


def _http_metadata(url):
    """Whether url is an HTTP metadata server's (Mooncake's http://host:port/metadata)."""
    return isinstance(url, str) and url.lower().startswith(("http://", "https://"))


def _ok(st):
    return 0 if st == 0 else -1


class TransferEngine:
    """Mooncake's TransferEngine (mooncake.engine) over libkvpool (kvpool_te.h)."""

    def __init__(self):
        self._te = None
        self._hostname = ""
        self._managed = {}  # address -> mmap
        self.last_status = 0

    # ---- initialization ----

    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "p2p")

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name, metadata_type):
        del device_name  # rdma's device: KVPOOL_RDMA_DEVICE (kvpool_te.h)
        if self._te is not None:
            _log.error("initialize: this engine is initialized already")
            self.last_status = _kvpool.STATUS["KVP_ERR_INVALID_ARG"]
            return -1
        if _http_metadata(metadata_server):
            # Mooncake's HTTP metadata server (its CI's engine scripts name one): peers are
            # found peer to peer instead, as store.setup takes the same URL, so a segment
            # is named by its host and rpc port: local_hostname's port, when it has one
            _log.info("initialize: metadata server %s not used: peers are found peer to peer "
                      "(this engine is %s)", metadata_server, local_hostname)
        elif metadata_server != "P2PHANDSHAKE":
            _log.error(
                "initialize: metadata %r (%s): kvpool's transfer engine takes P2PHANDSHAKE or "
                "an HTTP metadata URL (peers found peer to peer)",
                metadata_server,
                metadata_type,
            )
            self.last_status = _kvpool.STATUS["KVP_ERR_UNSUPPORTED"]
            return -1
        proto = protocol or "auto"
        st, te = _kvpool.te_create(local_hostname or "", "P2PHANDSHAKE", proto)
        self.last_status = st
        if st != 0:
            _log.error("initialize: %s", _kvpool.last_error())
            return -1
        self._te = te
        host = local_hostname or "127.0.0.1"
        if host.count(":") == 1:
            host = host.split(":")[0]
        self._hostname = f"{host}:{_kvpool.te_rpc_port(te)}"
        return 0

    def get_rpc_port(self):
        return _kvpool.te_rpc_port(self._need())

    def get_engine(self):
        return InnerTransferEngine(self)

    def get_engine_ptr(self):
        _unsupported("get_engine_ptr", "there is no C++ engine object to point at")

    def _need(self):
        if self._te is None:
            raise RuntimeError("TransferEngine: call initialize() first")
        return self._te

    # ---- memory ----

    def register_memory(self, buffer_addr, capacity, location="*"):
        del location
        self.last_status = _kvpool.te_register(self._need(), int(buffer_addr), int(capacity))
        return _ok(self.last_status)

    def unregister_memory(self, buffer_addr):
        self.last_status = _kvpool.te_unregister(self._need(), int(buffer_addr))
        return _ok(self.last_status)

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        del location
        if len(buffer_addresses) != len(capacities):
            self.last_status = _kvpool.STATUS["KVP_ERR_INVALID_ARG"]
            return -1
        for addr, cap in zip(buffer_addresses, capacities):
            if self.register_memory(addr, cap) != 0:
                return -1
        return 0

    def batch_unregister_memory(self, buffer_addresses):
        for addr in buffer_addresses:
            if self.unregister_memory(addr) != 0:
                return -1
        return 0

    def allocate_managed_buffer(self, length):
        """A registered buffer of length bytes (anonymous memory), its address; 0 on failure."""
        te = self._need()
        try:
            m = mmap.mmap(-1, int(length))
        except (OSError, ValueError):
            return 0
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        self.last_status = _kvpool.te_register(te, addr, int(length))
        if self.last_status != 0:
            m.close()
            return 0
        self._managed[addr] = m
        return addr

    def free_managed_buffer(self, buffer_addr, length):
        del length
        m = self._managed.pop(int(buffer_addr), None)
        if m is None:
            self.last_status = _kvpool.STATUS["KVP_ERR_NOT_FOUND"]
            return -1
        self.last_status = _kvpool.te_unregister(self._need(), int(buffer_addr))
        try:
            m.close()
        except BufferError:  # an exported view still holds it: left to the GC
            pass
        return 0

    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        data = bytes(src_ptr)
        if length > len(data):
            return -1
        ctypes.memmove(int(dest_address), data, int(length))
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        return ctypes.string_at(int(source_address), int(length))

    def get_first_buffer_address(self, segment_name):
        """The first (lowest) buffer segment_name registered: ours, or a peer's, asked over
        the data plane (REGIONS); 0 when none or the peer cannot be asked."""
        te = self._need()
        if segment_name == self._hostname:
            return _kvpool.te_first_buffer(te)
        st, regions = _kvpool.te_remote_regions(te, segment_name)
        self.last_status = st
        return regions[0][0] if st == 0 and regions else 0

    # ---- transfers ----

    def _move(self, target, opcode, buffers, peer_addresses, lengths):
        if not (len(buffers) == len(peer_addresses) == len(lengths)):
            self.last_status = _kvpool.STATUS["KVP_ERR_INVALID_ARG"]
            return -1
        self.last_status = _kvpool.te_transfer(
            self._need(), target, int(opcode), buffers, peer_addresses, lengths
        )
        return _ok(self.last_status)

    def _submit(self, target, opcode, buffers, peer_addresses, lengths):
        if not (len(buffers) == len(peer_addresses) == len(lengths)):
            self.last_status = _kvpool.STATUS["KVP_ERR_INVALID_ARG"]
            return 0
        st, batch_id = _kvpool.te_submit(
            self._need(), target, int(opcode), buffers, peer_addresses, lengths
        )
        self.last_status = st
        return batch_id if st == 0 else 0

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        return self._move(target_hostname, 1, [buffer], [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        return self._move(target_hostname, 0, [buffer], [peer_buffer_address], [length])

    def transfer_sync(
        self, target_hostname, buffer, peer_buffer_address, length, opcode, notify=None, transport_hint=""
    ):
        rc = self._move(target_hostname, opcode, [buffer], [peer_buffer_address], [length])
        return self._notify(target_hostname, notify) if rc == 0 and notify is not None else rc

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self._move(target_hostname, 1, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self._move(target_hostname, 0, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync(
        self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify=None, transport_hint=""
    ):
        rc = self._move(target_hostname, opcode, buffers, peer_buffer_addresses, lengths)
        return self._notify(target_hostname, notify) if rc == 0 and notify is not None else rc

    def _notify(self, target_hostname, notify):
        """After a transfer that moved: queue notify (name, msg) at the target (its
        get_notifies); 0, or -1 with last_status (KVP_ERR_DENIED, KVP_ERR_NO_SPACE)."""
        st = _kvpool.te_notify(self._need(), target_hostname, str(notify.name), str(notify.msg))
        self.last_status = st
        return _ok(st)

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self._submit(target_hostname, 1, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self._submit(target_hostname, 0, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint=""):
        return self._submit(target_hostname, opcode, buffers, peer_buffer_addresses, lengths)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        return self._submit(target_hostname, 1, [buffer], [peer_buffer_address], [length])

    def transfer_check_status(self, batch_id):
        """1 done, 0 in progress, -1 failed (Mooncake's -2, timed out, is -1 here with
        last_status KVP_ERR_TIMEOUT)."""
        st = _kvpool.te_status(self._need(), int(batch_id), 0)
        if st < 0:
            self.last_status = st
            return -1
        return st

    def get_batch_transfer_status(self, batch_ids):
        """Wait for every batch: 0 when all completed, -1 when any failed."""
        te = self._need()
        failed = False
        for bid in batch_ids:
            while True:
                st = _kvpool.te_status(te, int(bid), 1000)
                if st != 0:
                    break
            if st < 0:
                self.last_status = st
                failed = True
        return -1 if failed else 0

    def get_notifies(self):
        """The notifies peers sent this engine since the last call, oldest first
        (TransferNotify(name, msg)); each is returned once."""
        return [TransferNotify(n.decode("utf-8", "replace"), m.decode("utf-8", "replace"))
                for n, m in _kvpool.te_get_notifies(self._need())]

    # ---- not in this version ----

    def get_local_topology(self, device_name=None):
        _unsupported("get_local_topology", "no rdma topology in kvpool's transfer engine yet")

    def warmup_efa_segment(self, segment_name):
        _unsupported("warmup_efa_segment", "no EFA transport in kvpool")

    def send_probe(self, peer_server_name):
        """0 when the peer's engine answers (a REGIONS request over the data plane), else -1."""
        st, _ = _kvpool.te_remote_regions(self._need(), peer_server_name)
        self.last_status = st
        return _ok(st)

    # ---- the CUDA forms ----

    def _on_cuda(self, name, target, opcode, buffers, peer_addresses, lengths, stream_ptr):
        """Wait for the work issued on stream_ptr, then move (device or host memory); None,
        or RuntimeError naming the kvpool status (also in last_status)."""
        if not (len(buffers) == len(peer_addresses) == len(lengths)):
            self.last_status = _kvpool.STATUS["KVP_ERR_INVALID_ARG"]
            raise RuntimeError("buffers, peer_buffer_addresses and lengths have different size")
        st = _kvpool.te_transfer_on_cuda(
            self._need(), target, int(opcode), buffers, peer_addresses, lengths, int(stream_ptr or 0)
        )
        self.last_status = st
        if st != 0:
            why = next((k for k, v in _kvpool.STATUS.items() if v == st), "kvpool error")
            raise RuntimeError(f"TransferEngine.{name} to {target}: {why} ({st})")

    def transfer_write_on_cuda(self, target_hostname, buffer, peer_buffer_address, length, stream_ptr=0,
                               transport_hint=""):
        """Mooncake's transfer_write_on_cuda: after the work issued on the CUDA stream
        stream_ptr (0: the default stream), local buffer (device or host memory) ->
        peer_buffer_address at target_hostname. Returns None once the bytes moved; a
        failure raises RuntimeError (Mooncake: the process exits)."""
        self._on_cuda("transfer_write_on_cuda", target_hostname, 1, [buffer], [peer_buffer_address],
                      [length], stream_ptr)

    def transfer_read_on_cuda(self, target_hostname, buffer, peer_buffer_address, length, stream_ptr=0,
                              transport_hint=""):
        """Mooncake's transfer_read_on_cuda: peer_buffer_address at target_hostname -> local
        buffer (device or host memory), after the work issued on stream_ptr; as
        transfer_write_on_cuda."""
        self._on_cuda("transfer_read_on_cuda", target_hostname, 0, [buffer], [peer_buffer_address],
                      [length], stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                     stream_ptr=0, transport_hint=""):
        """The batch form of transfer_write_on_cuda (lists of equal length, else RuntimeError)."""
        self._on_cuda("batch_transfer_write_on_cuda", target_hostname, 1, buffers, peer_buffer_addresses,
                      lengths, stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                    stream_ptr=0, transport_hint=""):
        """The batch form of transfer_read_on_cuda."""
        self._on_cuda("batch_transfer_read_on_cuda", target_hostname, 0, buffers, peer_buffer_addresses,
                      lengths, stream_ptr)

    # ---- kvpool's own ----

    def metrics(self):
        """The engine's counters: ranges and bytes moved, failures, ranges peers moved here,
        refusals (outside what was registered, another host in protected mode, another uid
        on the shm socket; with credentials: refused_auth, and with KVPOOL_TE_ACL
        refused_role and refused_tenant), per target the route taken."""
        return _kvpool.te_counters(self._need())

    def close(self):
        """Stop serving and free the engine (also done when it is collected)."""
        if self._te is not None:
            _kvpool.te_destroy(self._te)
            self._te = None


TransferEngine.TransferOpcode = TransferOpcode
