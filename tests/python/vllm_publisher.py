"""A double of vLLM's ZmqEventPublisher, for kvpool-indexer's tests.

vLLM itself is not installable here, so this is written from vLLM's
vllm/distributed/kv_events.py (its types and ZmqEventPublisher):

- ``EventBatch(msgspec.Struct, array_like=True, omit_defaults=True)``:
  ``ts: float``, ``events: list``, ``data_parallel_rank: int | None = None``, so on
  the wire ``[ts, [event, ...]]`` or ``[ts, [event, ...], dp_rank]``;
- ``KVCacheEvent(..., array_like=True, omit_defaults=True, tag=True)``: an event is an
  array whose first element is its tag (the class name):
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  medium, lora_name]``, ``["BlockRemoved", block_hashes, medium]``,
  ``["AllBlocksCleared"]``; block hashes are ``ExternalBlockHash = bytes | int``
  (vLLM's sha256 / CBOR hashes are 32-byte digests);
- newer vLLM encodes the same structs as maps (``{"ts", "events",
  "data_parallel_rank"}``, each event a map with its tag in ``"type"`` and the field
  names as keys): ``encoding="map"`` here;
- ``ZmqEventPublisher``: a PUB socket sends ``(topic, seq.to_bytes(8, "big"),
  payload)``, seq from ``itertools.count()``, and appends ``(seq, payload)`` to a
  bounded replay deque; a ROUTER socket answers a request ``[identity, b"",
  start_seq (8 bytes big-endian)]`` with ``[identity, b"", seq, payload]`` for every
  buffered batch with ``seq >= start_seq``, then ``[identity, b"",
  (-1).to_bytes(8, "big", signed=True), b""]`` (``_service_replay``). Here the ROUTER
  is served by a thread of its own.

Deviations, all invisible to a subscriber:
- the PUB socket is an XPUB (ZMTP lets a SUB connect to either): it lets the test
  know when the indexer's subscription has arrived (``wait_subscribed``), so nothing
  is published into ZeroMQ's slow-joiner window and lost;
- test knobs vLLM does not have: a batch sent only to the replay buffer (the PUB
  "dropped" it), a seq skipped altogether, a restart (seq back to 0, buffer emptied),
  raw payloads (garbage, msgpack bombs), a mute replay socket;
- ``envelope(...)`` builds the standardized KV events contract's maps (``event_type``
  stored / removed / cleared), as kvpool masters publish them.

Hashes are given to the helpers as unsigned 64-bit ints. With ``hash_kind="bytes"``
each goes on the wire as a 32-byte digest whose last 8 bytes (big-endian) are that int:
vLLM's own conversion of a bytes hash to the u64 of its events, so the value a reader
takes from the digest is the int given here.
"""

import collections
import hashlib
import threading
import time

import msgpack
import zmq

MASK = (1 << 64) - 1
END_SEQ = (-1).to_bytes(8, "big", signed=True)
_UNSET = object()


def digest32(h):
    """The 32-byte sha256-like digest whose last 8 bytes big-endian are h."""
    h &= MASK
    return hashlib.sha256(b"vllm-double" + h.to_bytes(8, "big")).digest()[:24] \
        + h.to_bytes(8, "big")


class Event:
    """One event, independent of its encoding (the tests' model applies these too)."""

    __slots__ = ("kind", "hashes", "parent", "token_ids", "medium", "block_size",
                 "lora_id", "lora_name", "envelope", "tenant_id", "dp_rank", "extra")

    def __init__(self, kind, hashes=(), parent=None, token_ids=None, medium=None,
                 block_size=None, lora_id=None, lora_name=None, envelope=False,
                 tenant_id=None, dp_rank=None, extra=None):
        self.kind = kind  # "stored" | "removed" | "cleared"
        self.hashes = [int(h) & MASK for h in hashes]
        self.parent = None if parent is None else int(parent) & MASK
        self.token_ids = None if token_ids is None else list(token_ids)
        self.medium = medium
        self.block_size = block_size
        self.lora_id = lora_id
        self.lora_name = lora_name
        self.envelope = envelope
        self.tenant_id = tenant_id
        self.dp_rank = dp_rank
        self.extra = extra or {}

    def __repr__(self):
        return (f"Event({self.kind}, {len(self.hashes)} hashes, parent={self.parent}, "
                f"tokens={None if self.token_ids is None else len(self.token_ids)}, "
                f"medium={self.medium}, envelope={self.envelope}, tenant={self.tenant_id})")


def stored(hashes, parent=None, token_ids=None, medium=None, block_size=None, lora_id=None,
           lora_name=None):
    """vLLM's BlockStored."""
    return Event("stored", hashes, parent, token_ids, medium, block_size, lora_id, lora_name)


def removed(hashes, medium=None):
    """vLLM's BlockRemoved."""
    return Event("removed", hashes, medium=medium)


def cleared():
    """vLLM's AllBlocksCleared."""
    return Event("cleared")


def envelope(event_type, seq_hashes=(), medium="gpu", tenant_id="default", parent_hash=None,
             token_ids=None, dp_rank=0, model_name="m", block_size=16, base_block_idx=None,
             backend_id="backend-0", lora_name=None, additional_salt=None, **extra):
    """A standardized KV events contract map (the seed's envelope, as kvpool masters
    publish): event_type "stored" | "removed" | "cleared"."""
    assert event_type in ("stored", "removed", "cleared")
    e = Event(event_type, seq_hashes, parent_hash, token_ids, medium, block_size,
              lora_name=lora_name, envelope=True, tenant_id=tenant_id, dp_rank=dp_rank)
    e.extra = {"model_name": model_name, "base_block_idx": base_block_idx,
               "backend_id": backend_id, "additional_salt": additional_salt, **extra}
    return e


class Publisher:
    """An engine's KV event publisher as vLLM's ZmqEventPublisher serves it.

    encoding: "array" (msgspec array_like) or "map"; hash_kind: "int" or "bytes";
    replay: serve a replay ROUTER socket; topic: the first frame; buffer_steps: the
    replay deque's length. trim_trailing = True: array events end at their last
    non-None field (older vLLM's shorter structs).
    """

    def __init__(self, encoding="array", hash_kind="int", replay=True, topic=b"kv-events",
                 block_size=16, buffer_steps=10_000, ctx=None):
        assert encoding in ("array", "map") and hash_kind in ("int", "bytes")
        self.encoding = encoding
        self.hash_kind = hash_kind
        self.topic = topic
        self.block_size = block_size
        self.trim_trailing = False
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.pub = self._bind_pub(None)
        self.endpoint = self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.subscriptions = 0  # subscribe messages the XPUB has seen
        self.seq = 0  # the next seq
        self.buffer = collections.deque(maxlen=buffer_steps)
        self.lock = threading.Lock()
        self.replay_requests = []  # start seqs asked
        self.replay_mute = False  # True: read requests, never answer
        self.replay_endpoint = None
        self._stop = threading.Event()
        self._thread = None
        if replay:
            self._router = self.ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind("tcp://127.0.0.1:*")
            self.replay_endpoint = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    # ---- sockets ----

    def _bind_pub(self, endpoint):
        s = self.ctx.socket(zmq.XPUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscribe message, repeats included
        s.setsockopt(zmq.SNDHWM, 0)
        deadline = time.monotonic() + 5
        while True:
            try:
                s.bind(endpoint or "tcp://127.0.0.1:*")
                return s
            except zmq.ZMQError:
                # a rebind of the same port right after close: the old listener may not
                # be gone yet (ZeroMQ closes it on its I/O thread)
                if endpoint is None or time.monotonic() > deadline:
                    s.close()
                    raise
                time.sleep(0.01)

    def _serve_replay(self):
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(20):
                continue
            frames = self._router.recv_multipart()
            if len(frames) != 3:  # vLLM: "Invalid replay request", ignored
                continue
            ident, _, start_b = frames
            start = int.from_bytes(start_b, "big")
            with self.lock:
                self.replay_requests.append(start)
                if self.replay_mute:
                    continue
                held = [(s, p) for s, p in self.buffer if s >= start]
            for s, p in held:
                self._router.send_multipart([ident, b"", s.to_bytes(8, "big"), p])
            self._router.send_multipart([ident, b"", END_SEQ, b""])

    def _drain_subscriptions(self, timeout_ms=0):
        got = False
        while self.pub.poll(timeout_ms, zmq.POLLIN):
            msg = self.pub.recv()
            if msg[:1] == b"\x01":
                self.subscriptions += 1
                got = True
            timeout_ms = 0
        return got

    def wait_subscribed(self, count=1, timeout=10.0):
        """Wait until the XPUB has seen `count` subscribe messages in all: from then on
        what is published reaches the subscriber (no slow-joiner loss)."""
        deadline = time.monotonic() + timeout
        while True:
            self._drain_subscriptions()
            if self.subscriptions >= count:
                return
            left = deadline - time.monotonic()
            assert left > 0, f"no subscription #{count} on {self.endpoint} within {timeout} s"
            self._drain_subscriptions(int(min(left, 0.2) * 1000) + 1)

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._router.close()
        self.pub.close()
        if self._own_ctx:
            self.ctx.term()

    # ---- encoding ----

    def wire_hash(self, h):
        return digest32(h) if self.hash_kind == "bytes" else h

    def _encode_event(self, e):
        wh = self.wire_hash
        if e.envelope:
            m = {"event_id": 0, "timestamp": int(time.time() * 1000),
                 "event_type": e.kind, "model_name": e.extra.get("model_name"),
                 "block_size": e.block_size, "additional_salt": e.extra.get("additional_salt"),
                 "lora_name": e.lora_name, "tenant_id": e.tenant_id,
                 "backend_id": e.extra.get("backend_id"), "medium": e.medium,
                 "dp_rank": e.dp_rank}
            for k, v in e.extra.items():
                if k not in m and k not in ("base_block_idx",):
                    m[k] = v
            if e.kind != "cleared":
                m["seq_hashes"] = [wh(h) for h in e.hashes]
                m["base_block_idx"] = e.extra.get("base_block_idx")
            if e.kind == "stored":
                m["parent_hash"] = None if e.parent is None else wh(e.parent)
                m["token_ids"] = e.token_ids
            return m
        bs = e.block_size if e.block_size is not None else self.block_size
        if self.encoding == "array":
            if e.kind == "stored":
                arr = ["BlockStored", [wh(h) for h in e.hashes],
                       None if e.parent is None else wh(e.parent),
                       e.token_ids if e.token_ids is not None else [], bs, e.lora_id,
                       e.medium, e.lora_name]
                return self._trim(arr)
            if e.kind == "removed":
                return self._trim(["BlockRemoved", [wh(h) for h in e.hashes], e.medium])
            return ["AllBlocksCleared"]
        if e.kind == "stored":
            return {"type": "BlockStored", "block_hashes": [wh(h) for h in e.hashes],
                    "parent_block_hash": None if e.parent is None else wh(e.parent),
                    "token_ids": e.token_ids if e.token_ids is not None else [],
                    "block_size": bs, "lora_id": e.lora_id, "medium": e.medium,
                    "lora_name": e.lora_name}
        if e.kind == "removed":
            return {"type": "BlockRemoved", "block_hashes": [wh(h) for h in e.hashes],
                    "medium": e.medium}
        return {"type": "AllBlocksCleared"}

    def _trim(self, arr):
        # trim_trailing: older vLLM's structs (no medium, lora_name) end earlier; the
        # fields they lack are None here, so trailing Nones are dropped
        if self.trim_trailing:
            while arr and arr[-1] is None:
                arr.pop()
        return arr

    def encode(self, events, dp_rank=None, ts=None):
        """The msgpack payload of one batch."""
        ts = time.time() if ts is None else ts
        evs = [self._encode_event(e) for e in events]
        if self.encoding == "map":
            batch = {"ts": ts, "events": evs}
            if dp_rank is not None:
                batch["data_parallel_rank"] = dp_rank
        else:
            batch = [ts, evs] if dp_rank is None else [ts, evs, dp_rank]
        return msgpack.packb(batch, use_bin_type=True)

    # ---- publishing ----

    def publish_raw(self, payload, *, pub=True, buffer=True, seq=None):
        """Send one batch's payload (bytes) with the next seq (or `seq`); -> its seq.
        pub=False: only the replay buffer has it (the PUB lost it); buffer=False: the
        replay buffer does not keep it."""
        s = self.seq if seq is None else seq
        self._drain_subscriptions()
        if buffer:
            with self.lock:
                self.buffer.append((s, payload))
        if pub:
            self.pub.send_multipart([self.topic, s.to_bytes(8, "big"), payload])
        self.seq = s + 1
        return s

    def publish(self, events, dp_rank=None, **kw):
        """Encode and send one batch; -> its seq."""
        return self.publish_raw(self.encode(events, dp_rank), **kw)

    def skip(self, n=1):
        """Lose n seqs altogether: neither published nor kept for replay."""
        self.seq += n

    @property
    def last_seq(self):
        return self.seq - 1

    def restart(self, rebind=False):
        """The engine restarted: seq back to 0, replay buffer empty. rebind=True also
        closes and binds the PUB socket again on the same endpoint (the subscriber has
        to reconnect: wait_subscribed(self.subscriptions + 1) before publishing)."""
        with self.lock:
            self.buffer.clear()
            self.replay_requests.clear()
        self.seq = 0
        if rebind:
            self.pub.close()
            self.pub = self._bind_pub(self.endpoint)
