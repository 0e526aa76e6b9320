"""mooncake.engine's RpcInterface on kvpool: Mooncake's channel for bytes and tensors between
processes (mooncake-transfer-engine/src/transport/rpc_communicator at the commit
docs/python.md names), with Mooncake's calls and answers: send_data / send_tensor return 0
once the receiver's callback ran (-1 on failure), their _async forms an asyncio future, the
data callback gets {"source": ..., "data": bytes}, the tensor callback a ReceivedTensor.
The wire is kvpool's own (a frame: KRPC, its kind, the sender's address, a tensor's shape
and dtype, the bytes; a status back): it talks to kvpool's RpcInterface, not Mooncake's.

Who may send (Mooncake's takes anyone who reaches the port):
- with KVPOOL_TLS_CERT, KVPOOL_TLS_KEY and KVPOOL_TLS_CA (the library's credential), both
  sides speak TLS 1.3 and each presents its certificate, verified against the CA (and
  KVPOOL_TLS_CRL when set): a stranger's handshake fails;
- else, in protected mode (KVPOOL_AUTH unset or "protected", as the transfer engine's),
  only processes of this host running as this user (or root) are taken: the peer's socket
  is looked up in /proc/net/tcp{,6};
- KVPOOL_AUTH=none takes whoever reaches the port.
What one connection can cost: a frame of at most MAX_FRAME bytes, read whole within the
timeout (a trickle does not reset it), at most MAX_CONNS connections at once (one more is
closed at once), the bodies being read together within BODY_BUDGET; a refused frame closes
its connection. Each refusal is counted (RpcInterface.refused).
"""

import json as _json
import logging as _logging
import os as _os
import socket as _socket
import ssl as _ssl
import struct as _struct
import threading as _threading
import time as _time

__all__ = ["RpcInterface", "CoroRPCInterface", "ReceivedData", "ReceivedTensor",
           "create_rpc_client", "create_rpc_server"]

_log = _logging.getLogger("mooncake.engine")

MAGIC = b"KRPC"
KIND_DATA, KIND_TENSOR = 1, 2
_HDR = _struct.Struct("<4sBHIQ")  # magic, kind, source length, meta length, payload length
_ACK = _struct.Struct("<i")
MAX_FRAME = 256 << 20
MAX_META = 4096
MAX_CONNS = 64
BODY_BUDGET = 1 << 30


class ReceivedData:
    """Mooncake's ReceivedData: source_address, data_size, get_bytes(), get_memory_view()."""

    def __init__(self, source_address="", data=b""):
        self.source_address = source_address
        self._data = bytes(data)
        self.data_size = len(self._data)

    def get_bytes(self):
        return self._data

    def get_memory_view(self):
        return memoryview(self._data)


class ReceivedTensor:
    """Mooncake's ReceivedTensor: source_address, shape, dtype (its name: "float32"),
    total_bytes, get_data_size(), get_data_as_bytes(), get_memory_view()."""

    def __init__(self, source_address, data, shape, dtype):
        self.source_address = source_address
        self._data = bytes(data)
        self.shape = list(shape)
        self.dtype = dtype
        self.total_bytes = len(self._data)

    def get_data_size(self):
        return len(self._data)

    def get_data_as_bytes(self):
        return self._data

    def get_memory_view(self):
        return memoryview(self._data)


def _split(address):
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def _tls(server):
    """An SSL context from the library's credential, or None without one."""
    cert, key, ca = (_os.environ.get(v) for v in ("KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY",
                                                  "KVPOOL_TLS_CA"))
    if not (cert and key and ca):
        return None
    ctx = _ssl.SSLContext(_ssl.PROTOCOL_TLS_SERVER if server else _ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = _ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(ca)
    crl = _os.environ.get("KVPOOL_TLS_CRL")
    if crl:
        ctx.load_verify_locations(crl)
        ctx.verify_flags |= _ssl.VERIFY_CRL_CHECK_LEAF
    ctx.verify_mode = _ssl.CERT_REQUIRED
    ctx.check_hostname = False  # peers are named by address; the CA vouches for them
    return ctx


def _peer_uid(sock):
    """The uid owning the peer's end of a loopback TCP connection (/proc/net/tcp{,6}), or
    None when it is not found (not on this host)."""
    peer, local = sock.getpeername(), sock.getsockname()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    p = line.split()
                    if int(p[1].rsplit(":", 1)[1], 16) == peer[1] and \
                            int(p[2].rsplit(":", 1)[1], 16) == local[1]:
                        return int(p[7])
        except OSError:
            continue
    return None


def _recv(sock, n, deadline):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        left = deadline - _time.monotonic()
        if left <= 0:
            raise TimeoutError("the frame did not arrive within the timeout")
        sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("the peer closed the connection")
        got += k
    return buf


class RpcInterface:
    """Mooncake's RpcInterface (mooncake.engine)."""

    def __init__(self):
        self._listen = ""
        self._timeout = 30.0
        self._pool_size = 100
        self._conns_max = 8
        self._data_cb = None
        self._tensor_cb = None
        self._server = None  # the listening socket
        self._stop = _threading.Event()
        self._lock = _threading.Lock()
        self._pool = {}  # target -> idle connections
        self._open = 0  # server connections now
        self._body_bytes = 0  # bodies being read now
        self._ready = False
        self.refused = 0

    # ---- setup ----

    def initialize(self, listen_address="", thread_count=0, timeout_seconds=30, pool_size=100):
        if self._ready:
            return False
        if listen_address:
            try:
                _split(listen_address)
            except ValueError:
                _log.error("RpcInterface: listen address %r is no HOST:PORT", listen_address)
                return False
        self._listen = listen_address
        self._timeout = float(timeout_seconds) if timeout_seconds else 30.0
        self._pool_size = max(1, int(pool_size))
        self._conns_max = min(MAX_CONNS, max(8, int(thread_count)))
        self._ready = True
        return True

    def initialize_client(self, pool_size=100, timeout_seconds=30):
        return self.initialize("", 0, timeout_seconds, pool_size)

    def initialize_server(self, listen_address, thread_count=8, timeout_seconds=30):
        return self.initialize(listen_address, thread_count, timeout_seconds, 100)

    def set_data_receive_callback(self, callback):
        self._data_cb = callback

    def set_tensor_receive_callback(self, callback):
        self._tensor_cb = callback

    # ---- the server ----

    def _bind(self):
        if not self._ready or not self._listen or self._server is not None:
            return False
        host, port = _split(self._listen)
        try:
            s = _socket.create_server((host, port), family=_socket.AF_INET6 if ":" in host
                                      else _socket.AF_INET, backlog=self._conns_max)
        except OSError as e:
            _log.error("RpcInterface: cannot listen on %s: %s", self._listen, e)
            return False
        s.settimeout(0.2)
        self._server = s
        self._stop.clear()
        self._tls = _tls(True)
        self._auth = _os.environ.get("KVPOOL_AUTH", "protected") or "protected"
        return True

    def start_server(self):
        """Serve in this thread until stop_server(); False: cannot listen."""
        if not self._bind():
            return False
        self._serve()
        return True

    def start_server_async(self):
        """Serve on a thread of its own; False: cannot listen."""
        if not self._bind():
            return False
        _threading.Thread(target=self._serve, name="mooncake-rpc", daemon=True).start()
        return True

    def stop_server(self):
        self._stop.set()

    def _serve(self):
        s = self._server
        try:
            while not self._stop.is_set():
                try:
                    conn, _ = s.accept()
                except (TimeoutError, _socket.timeout):
                    continue
                except OSError:
                    break
                with self._lock:
                    full = self._open >= self._conns_max
                    self._open += not full
                    self.refused += full
                if full:
                    conn.close()
                    continue
                _threading.Thread(target=self._conn, args=(conn,), daemon=True).start()
        finally:
            s.close()
            self._server = None

    def _admit(self, conn):
        """The connection, admitted (TLS handshake done), or None (closed, counted)."""
        conn.settimeout(self._timeout)
        try:
            if self._tls is not None:
                return self._tls.wrap_socket(conn, server_side=True)
            if self._auth != "none":
                host = conn.getpeername()[0]
                if not (host.startswith("127.") or host in ("::1",) or
                        host.startswith("::ffff:127.")):
                    raise PermissionError(f"a peer of another host ({host}): protected mode "
                                          "takes this host's only (KVPOOL_AUTH=none, or TLS)")
                uid = _peer_uid(conn)
                if uid is None or (uid != _os.getuid() and uid != 0):
                    raise PermissionError("a peer not of this host's user (protected mode)")
            return conn
        except (OSError, _ssl.SSLError, ValueError) as e:
            _log.warning("RpcInterface: a connection refused: %s", e)
            with self._lock:
                self.refused += 1
            conn.close()
            return None

    def _conn(self, conn):
        try:
            conn = self._admit(conn)
            while conn is not None and not self._stop.is_set() and self._frame(conn):
                pass
        finally:
            if conn is not None:
                conn.close()
            with self._lock:
                self._open -= 1

    def _frame(self, conn):
        """Read one frame, hand it to its callback, answer. False: the connection ends."""
        try:
            conn.settimeout(self._timeout)  # an idle connection ends after the timeout
            first = conn.recv(1)
            if not first:
                return False
        except OSError:
            return False
        try:
            deadline = _time.monotonic() + self._timeout  # the rest of the frame within it
            head = first + bytes(_recv(conn, _HDR.size - 1, deadline))
            magic, kind, slen, mlen, plen = _HDR.unpack(head)
            if magic != MAGIC or kind not in (KIND_DATA, KIND_TENSOR) or mlen > MAX_META or \
                    plen > MAX_FRAME:
                raise ValueError("not a frame of ours, or one over the limits")
            with self._lock:
                over = self._body_bytes + plen > BODY_BUDGET
                self._body_bytes += 0 if over else plen
            if over:
                raise ValueError("the bodies being read are at their budget")
            try:
                src = bytes(_recv(conn, slen, deadline)).decode("utf-8", "replace")
                meta = bytes(_recv(conn, mlen, deadline))
                data = _recv(conn, plen, deadline)
            finally:
                with self._lock:
                    self._body_bytes -= plen
            status = self._deliver(kind, src, meta, data)
            conn.sendall(_ACK.pack(status))
            return True
        except (OSError, ValueError, _struct.error) as e:
            if not isinstance(e, ConnectionError):  # (a frame cut short: its sender's end)
                with self._lock:
                    self.refused += 1
                _log.warning("RpcInterface: a connection closed: %s", e)
            return False

    def _deliver(self, kind, src, meta, data):
        try:
            if kind == KIND_TENSOR and self._tensor_cb is not None:
                m = _json.loads(meta)
                self._tensor_cb(ReceivedTensor(src, data, m["shape"], m["dtype"]))
            elif self._data_cb is not None:
                self._data_cb({"source": src, "data": bytes(data)})
            return 0
        except Exception as e:  # noqa: BLE001 (a callback's failure: logged, as Mooncake)
            _log.error("RpcInterface: error in receive callback: %s", e)
            return 0

    # ---- the client ----

    def _connect(self, target):
        """(a connection to target, whether it was an idle one of the pool)."""
        with self._lock:
            idle = self._pool.get(target)
            if idle:
                return idle.pop(), True
        host, port = _split(target)
        sock = _socket.create_connection((host, port), timeout=self._timeout)
        ctx = _tls(False)
        return (ctx.wrap_socket(sock) if ctx is not None else sock), False

    def _send(self, target, kind, meta, payload):
        if not self._ready or not isinstance(target, str):
            return -1
        payload = memoryview(payload).cast("B") if len(memoryview(payload)) else b""
        if len(payload) > MAX_FRAME or len(meta) > MAX_META:
            _log.error("RpcInterface: a frame of %d bytes is over %d", len(payload), MAX_FRAME)
            return -1
        src = self._listen.encode()
        for _ in (0, 1):  # an idle pooled connection the peer closed: once more
            try:
                sock, reused = self._connect(target)
            except (OSError, ValueError) as e:
                _log.error("RpcInterface: cannot reach %s: %s", target, e)
                return -1
            try:
                sock.settimeout(self._timeout)
                sock.sendall(_HDR.pack(MAGIC, kind, len(src), len(meta), len(payload)) + src +
                             meta)
                sock.sendall(payload)
                (status,) = _ACK.unpack(_recv(sock, _ACK.size, _time.monotonic() +
                                               self._timeout))
            except (OSError, _struct.error) as e:
                sock.close()
                if reused:
                    continue
                _log.error("RpcInterface: sending to %s failed: %s", target, e)
                return -1
            with self._lock:
                idle = self._pool.setdefault(target, [])
                if len(idle) < self._pool_size:
                    idle.append(sock)
                    sock = None
            if sock is not None:
                sock.close()
            return 0 if status == 0 else -1
        return -1

    def send_data(self, target_address, data):
        """data (bytes-like) to the server at target_address: 0 once its callback ran,
        -1 on failure."""
        return self._send(target_address, KIND_DATA, b"", data)

    def send_tensor(self, target_address, tensor):
        """A tensor (its bytes, shape and dtype) to target_address: 0 or -1."""
        if not all(hasattr(tensor, a) for a in ("data_ptr", "shape", "dtype")):
            _log.error("RpcInterface.send_tensor: not a tensor")
            return -1
        t = tensor.detach().cpu().contiguous()
        meta = _json.dumps({"shape": list(t.shape),
                            "dtype": str(t.dtype).replace("torch.", "")}).encode()
        raw = t.view(-1).view(__import__("torch").uint8).numpy() if t.numel() else b""
        return self._send(target_address, KIND_TENSOR, meta, raw)

    def _future(self, loop, fn, *args):
        fut = loop.create_future()

        def run():
            try:
                rc = fn(*args)
            except Exception as e:  # noqa: BLE001
                loop.call_soon_threadsafe(fut.set_exception, RuntimeError(f"Send error: {e}"))
                return
            if rc >= 0:
                loop.call_soon_threadsafe(fut.set_result, rc)
            else:
                loop.call_soon_threadsafe(fut.set_exception, RuntimeError("Send data failed"))

        _threading.Thread(target=run, daemon=True).start()
        return fut

    def send_data_async(self, target_address, data, loop):
        return self._future(loop, self.send_data, target_address, bytes(data))

    def send_tensor_async(self, target_address, tensor, loop):
        return self._future(loop, self.send_tensor, target_address, tensor)

    def close(self):
        self.stop_server()
        with self._lock:
            pool, self._pool = self._pool, {}
        for socks in pool.values():
            for s in socks:
                s.close()


CoroRPCInterface = RpcInterface


def create_rpc_client(local_rank=0, world_size=1):
    """Mooncake's: a client (30 s timeout, 10 connections a target)."""
    c = RpcInterface()
    c.initialize("", 0, 30, 10)
    return c


def create_rpc_server(local_rank=0, world_size=1):
    """Mooncake's: a server set up on 0.0.0.0:8080 (start it with start_server[_async])."""
    s = RpcInterface()
    s.initialize("0.0.0.0:8080", 0, 30, 10)
    return s

