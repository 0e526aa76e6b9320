#!/usr/bin/env bash
# kvpool quick start: install dependencies, build, start a master and one
# local segment server on 127.0.0.1, store and read back a sample object
# with the CLI, start kvpool-indexer fed by the master's KV events and show a block it
# found, then keep serving in the foreground until Ctrl-C.
#
#   deploy/quickstart.sh [SEGMENT_SIZE]        (default 256MiB)
#   KVPOOL_PORT=50051 deploy/quickstart.sh     (master port)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SEG_SIZE=${1:-256MiB}
PORT=${KVPOOL_PORT:-50051}
HTTP_PORT=${KVPOOL_HTTP_PORT:-9003}
EVENTS_PORT=${KVPOOL_EVENTS_PORT:-5557} # the master's KV events (and +1: their replay)
INDEXER_PORT=${KVPOOL_INDEXER_PORT:-13333}

deploy/install-deps.sh
if [ ! -f build/build.ninja ]; then
  meson setup build >/dev/null
fi
targets=(master/kvpool-master client/kvpool indexer/kvpool-indexer)
ninja -C build "${targets[@]}" >/dev/null || ninja -C build "${targets[@]}"
MASTER_BIN=$ROOT/build/master/kvpool-master
CLI=$ROOT/build/client/kvpool
INDEXER_BIN=$ROOT/build/indexer/kvpool-indexer

tmp=$(mktemp -d)
mpid=""
spid=""
ipid=""
cleanup() {
  trap - EXIT INT TERM
  [ -n "$ipid" ] && kill -TERM "$ipid" 2>/dev/null && wait "$ipid" 2>/dev/null || true
  [ -n "$spid" ] && kill -TERM "$spid" 2>/dev/null && wait "$spid" 2>/dev/null || true
  [ -n "$mpid" ] && kill -TERM "$mpid" 2>/dev/null && wait "$mpid" 2>/dev/null || true
  rm -rf "$tmp"
  echo "kvpool: stopped."
}
trap cleanup EXIT
trap 'exit 0' INT TERM

wait_line() { # file, seconds
  for _ in $(seq 1 $(( $2 * 50 ))); do
    [ -s "$1" ] && grep -q . "$1" && return 0
    sleep 0.02
  done
  return 1
}

# its own session: a Ctrl-C in the terminal reaches the script and the segment, which
# drains into the pool while the master is still up; cleanup stops the master last
setsid "$MASTER_BIN" --listen "127.0.0.1:$PORT" --http-listen "127.0.0.1:$HTTP_PORT" \
  --kv-events-bind "tcp://127.0.0.1:$EVENTS_PORT" \
  --kv-events-replay-bind "tcp://127.0.0.1:$((EVENTS_PORT + 1))" \
  --kv-events-model quickstart --kv-events-block-size 16 \
  --ready-fd 3 3>"$tmp/master.addr" &
mpid=$!
wait_line "$tmp/master.addr" 10 || { echo "kvpool-master did not start (port $PORT, $HTTP_PORT or $EVENTS_PORT busy? set KVPOOL_PORT, KVPOOL_HTTP_PORT, KVPOOL_EVENTS_PORT)"; exit 1; }
MASTER=$(head -1 "$tmp/master.addr")
export KVPOOL_MASTER=$MASTER

"$CLI" serve --segment-size "$SEG_SIZE" --ready-fd 3 3>"$tmp/seg.name" >/dev/null &
spid=$!
wait_line "$tmp/seg.name" 10 || { echo "kvpool serve did not start"; exit 1; }

# store a sample object and read it back
head -c $((4 << 20)) /dev/urandom >"$tmp/sample.bin"
"$CLI" put quickstart/sample "$tmp/sample.bin"
"$CLI" get quickstart/sample "$tmp/sample.out"
cmp -s "$tmp/sample.bin" "$tmp/sample.out" && echo "round trip of a 4 MiB object: bytes match"
"$CLI" exist quickstart/sample quickstart/missing || true
echo
"$CLI" stat

# The router's indexer, fed by the master's KV events: a key that ends in a block hash is
# a block the pool holds, on CPU (docs/indexer.md).
setsid "$INDEXER_BIN" --listen "127.0.0.1:$INDEXER_PORT" --ready-fd 3 3>"$tmp/indexer.addr" &
ipid=$!
if wait_line "$tmp/indexer.addr" 10; then
  /usr/bin/python3 - "$INDEXER_PORT" "$EVENTS_PORT" "$CLI" "$tmp/sample.bin" <<'EOF_PY' || true
import json, subprocess, sys, time, urllib.request
port, events, cli, sample = sys.argv[1:5]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())
post("/register", {"endpoint": f"tcp://127.0.0.1:{events}",
                   "replay_endpoint": f"tcp://127.0.0.1:{int(events) + 1}", "type": "kvpool",
                   "modelname": "quickstart", "instance_id": "this-pool", "block_size": 16,
                   "dp_rank": 0})
h = 0x51c0ffee00000000
for i in range(20):  # until the indexer's subscription is up (ZeroMQ connects in the background)
    subprocess.run([cli, "put", f"quickstart@{h + i:016x}", sample], check=True)
    time.sleep(0.1)
    a = post("/query_by_hash", {"model": "quickstart", "block_size": 16, "seq_hashes": [h + i]})
    if a["default"]["this-pool"]["CPU"] > 0:
        print(f"indexer: the block of key quickstart@{h + i:016x} is in the pool:", json.dumps(a))
        break
else:
    print("indexer: the master's events did not reach it (see its log)")
EOF_PY
else
  echo "kvpool-indexer did not start (port $INDEXER_PORT busy? set KVPOOL_INDEXER_PORT)"
fi
# the master's HTTP: /health and a metric the round trip above moved
if exec 4<>"/dev/tcp/127.0.0.1/$HTTP_PORT"; then
  printf 'GET /metrics HTTP/1.0\r\n\r\n' >&4
  echo "metrics (http://127.0.0.1:$HTTP_PORT/metrics): $(grep -E '^kvpool_(puts|gets)_total' <&4 | tr '\n' ' ')"
  exec 4>&-
fi
cat <<EOT

kvpool is running: master $MASTER, one $SEG_SIZE segment ($(head -1 "$tmp/seg.name")).
Try, in another shell:
  export KVPOOL_MASTER=$MASTER
  $CLI put mykey /etc/os-release
  $CLI get mykey -
  $CLI exist mykey otherkey
  $CLI stat
  $CLI serve --segment-size 1GiB      # contribute another segment
  curl http://127.0.0.1:$HTTP_PORT/metrics   # Prometheus metrics (also /health, /api/v1/stat)
  curl http://127.0.0.1:$INDEXER_PORT/instances  # the indexer (docs/indexer.md)
Press Ctrl-C to stop the processes.
EOT
wait "$mpid"
