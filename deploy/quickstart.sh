#!/usr/bin/env bash
# kvpool quick start: install dependencies, build, start a master and one
# local segment server on 127.0.0.1, store and read back a sample object
# with the CLI, then keep serving in the foreground until Ctrl-C.
#
#   deploy/quickstart.sh [SEGMENT_SIZE]        (default 256MiB)
#   KVPOOL_PORT=50051 deploy/quickstart.sh     (master port)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SEG_SIZE=${1:-256MiB}
PORT=${KVPOOL_PORT:-50051}
HTTP_PORT=${KVPOOL_HTTP_PORT:-9003}

deploy/install-deps.sh
if [ ! -f build/build.ninja ]; then
  meson setup build >/dev/null
fi
ninja -C build master/kvpool-master client/kvpool >/dev/null || ninja -C build master/kvpool-master client/kvpool
MASTER_BIN=$ROOT/build/master/kvpool-master
CLI=$ROOT/build/client/kvpool

tmp=$(mktemp -d)
mpid=""
spid=""
cleanup() {
  trap - EXIT INT TERM
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
  --ready-fd 3 3>"$tmp/master.addr" &
mpid=$!
wait_line "$tmp/master.addr" 10 || { echo "kvpool-master did not start (port $PORT or $HTTP_PORT busy? set KVPOOL_PORT, KVPOOL_HTTP_PORT)"; exit 1; }
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
Press Ctrl-C to stop both processes.
EOT
wait "$mpid"
