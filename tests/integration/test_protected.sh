#!/usr/bin/env bash
# test_protected.sh - protected mode (docs/security.md): with no credentials configured, the
# master and the data servers take connections from their own host only.
#
# Two hosts: this one, and a network namespace the test makes, joined by a veth pair with
# addresses of our own (10.252.N.1 here, 10.252.N.2 there). A master and a segment owner
# (kvpool serve) run here on 10.252.N.1; kvpool commands run on both hosts. Checked:
#   - a client on the other host is refused by a protected master (KVP_ERR_DENIED, the
#     message says what to do) and the refusal is counted in the master's /metrics;
#   - a client on this host, through the same non-loopback address, is served;
#   - with --auth none on the master, the other host's client reaches it, but a protected
#     data server refuses its get (nothing read: exit 1, the refusal counted on the
#     owner's /metrics, the object intact for a local reader);
#   - with --auth none on the owner too, the other host's get returns the bytes.
# Needs root (namespaces, veth); exits 77 (skip) without. Everything it starts it stops
# by PID; the namespace and the veth go away in the EXIT trap, failed or not.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
n=0

MASTER=${KVPOOL_MASTER_BIN:?set KVPOOL_MASTER_BIN}
CLI=${KVPOOL_CLI_BIN:?set KVPOOL_CLI_BIN}
if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null; then
    echo "SKIP: needs root and iproute2 (network namespaces)"
    exit 77
fi

dir=$(mktemp -d)
ns="kvpt-prot-$$"
veth="kvpt$$"
net="10.252.$(($$ % 200 + 20))"
here="$net.1"
there="$net.2"
pids=()

cleanup() {
    [[ $BASHPID == $$ ]] || return 0
    for p in "${pids[@]}"; do
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    ip link del "$veth" 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT

ip netns add "$ns" || { echo "SKIP: cannot make a network namespace"; exit 77; }
ip link add "$veth" type veth peer name eth0 netns "$ns" || fail "veth pair"
ip addr add "$here/24" dev "$veth" && ip link set "$veth" up || fail "address here"
ip -n "$ns" addr add "$there/24" dev eth0 && ip -n "$ns" link set eth0 up &&
    ip -n "$ns" link set lo up || fail "address there"
ok "two hosts: $here (here) and $there (namespace $ns)"

# A free port on 127.0.0.1 for a /metrics listener.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_master ARGS...: a master on $here, its address in $maddr, its pid in $mpid.
start_master() {
    mkfifo "$dir/m.fifo"
    "$MASTER" --listen "$here:0" --ready-fd 3 --http-listen "127.0.0.1:$mhttp" "$@" \
        3>"$dir/m.fifo" 2>>"$dir/master.log" &
    mpid=$!
    pids+=("$mpid")
    maddr=$(read_ready "$dir/m.fifo") || fail "master ready" "$dir/master.log"
    rm -f "$dir/m.fifo"
}

# start_owner ARGS...: kvpool serve (32 MiB on $here), its pid in $opid.
start_owner() {
    mkfifo "$dir/o.fifo"
    "$CLI" --master "$maddr" serve --segment-size 32MiB --data-host "$here" --ready-fd 3 \
        --http-listen "127.0.0.1:$ohttp" --drain-timeout 0 "$@" 3>"$dir/o.fifo" \
        >>"$dir/owner.out" 2>>"$dir/owner.log" &
    opid=$!
    pids+=("$opid")
    read_ready "$dir/o.fifo" >/dev/null || fail "owner ready" "$dir/owner.log"
    rm -f "$dir/o.fifo"
}

metric() { # URL NAME: the value of a metric line that starts with NAME
    curl -fsS "$1" | awk -v k="$2" 'index($0, k) == 1 {print $NF}'
}

there_cli() {
    ip netns exec "$ns" "$CLI" --master "$maddr" --transport tcp --timeout-ms 3000 "$@"
}

mhttp=$(free_port)
ohttp=$(free_port)
head -c 100000 /dev/urandom >"$dir/obj"

# 1. a protected master refuses the other host
start_master
if there_cli exist k1 >"$dir/out" 2>"$dir/err"; then
    fail "a client of another host reached a protected master" "$dir/err"
fi
grep -q "protected mode" "$dir/err" || fail "the refusal says protected mode" "$dir/err"
ok "a protected master refuses a client of another host: $(head -c 160 "$dir/err")"
refused=$(metric "http://127.0.0.1:$mhttp/metrics" 'kvpool_connections_refused_total{reason="protected_mode"}')
[[ ${refused:-0} -ge 1 ]] || fail "the master counts the refusal (got '$refused')"
ok "the master's /metrics counts it: kvpool_connections_refused_total{reason=\"protected_mode\"} $refused"

# 2. this host, through its non-loopback address, is served
start_owner
"$CLI" --master "$maddr" put k1 "$dir/obj" 2>"$dir/err" || fail "a local put" "$dir/err"
"$CLI" --master "$maddr" --transport tcp get k1 "$dir/back" 2>"$dir/err" ||
    fail "a local get over tcp" "$dir/err"
cmp -s "$dir/obj" "$dir/back" || fail "the local get's bytes"
ok "this host's client, through $here, puts and gets (tcp) the same bytes"
stop "$opid" || true
stop "$mpid" || true
pids=()

# 3. master --auth none, owner protected: the other host's get is refused by the owner
start_master --auth none
start_owner
"$CLI" --master "$maddr" put k2 "$dir/obj" 2>"$dir/err" || fail "a local put" "$dir/err"
there_cli exist k2 >"$dir/out" 2>"$dir/err" || fail "the other host's exist (master open)" "$dir/err"
grep -q "yes" "$dir/out" || fail "the other host sees k2" "$dir/out"
ok "with --auth none the other host's client reaches the master"
if there_cli get k2 "$dir/stolen" 2>"$dir/err"; then
    fail "a protected data server served another host" "$dir/err"
fi
[[ ! -s "$dir/stolen" ]] || fail "bytes came back from a refusing data server"
grep -qi "protected mode\|refused" "$dir/err" || fail "the get says why" "$dir/err"
ok "a protected data server refuses the other host's get, nothing read: $(head -c 160 "$dir/err")"
refused=$(metric "http://127.0.0.1:$ohttp/metrics" 'kvpool_connections_refused_total{reason="protected_mode"}')
[[ ${refused:-0} -ge 1 ]] || fail "the owner counts the refusal (got '$refused')"
ok "the owner's /metrics counts it ($refused)"
"$CLI" --master "$maddr" --transport tcp get k2 "$dir/back" 2>"$dir/err" ||
    fail "a local get after the refusal" "$dir/err"
cmp -s "$dir/obj" "$dir/back" || fail "k2's bytes after the refusal"
ok "k2 is intact for a local reader"
stop "$opid" || true

# 4. the owner with --auth none too: the other host gets the bytes
start_owner --auth none
"$CLI" --master "$maddr" put k3 "$dir/obj" 2>"$dir/err" || fail "a local put" "$dir/err"
there_cli get k3 "$dir/there" 2>"$dir/err" || fail "the other host's get (all open)" "$dir/err"
cmp -s "$dir/obj" "$dir/there" || fail "the other host's bytes"
ok "with --auth none on both, the other host gets the same bytes"
stop "$opid" || true
stop "$mpid" || true
pids=()
echo "$n passed, 0 failed"
