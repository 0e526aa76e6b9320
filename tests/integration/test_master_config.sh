#!/usr/bin/env bash
# test_master_config.sh - kvpool-master --config FILE end to end: the real
# binary reading real files (common/conf.c, master/main.c).
#
# Needs $KVPOOL_MASTER_BIN. What the file set is seen from outside: the
# address the master binds, which it writes on --ready-fd 3 into a fifo (no
# sleeps, no log scraping). The file listens on 127.0.0.2 (port 0), so its
# effect shows apart from both the default (127.0.0.1:50051) and a command-line
# --listen 127.0.0.1:0. Every master is killed by the PID we started it with
# and reaped, and must exit 0 on SIGTERM (under ASan: no leaks). Prints
# "ok N - what" per check, stops at the first failure with "not ok N - what"
# and a non-zero exit.
set -euo pipefail

: "${KVPOOL_MASTER_BIN:?set KVPOOL_MASTER_BIN to the kvpool-master binary}"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-master-config-test.XXXXXX")
mpid=""
n=0

cleanup() {
    local rc=$?
    # bash runs this trap in a background subshell too (stop's watchdog) when a signal
    # reaches it before its `trap - EXIT`: only the script itself cleans up
    if [[ "$BASHPID" != "$$" ]]; then
        exit "$rc"
    fi
    if [[ -n "$mpid" ]]; then
        kill -KILL "$mpid" 2>/dev/null || true
        wait "$mpid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT

# ok, fail, read_ready, stop
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

# Start a master with args "$@" (its ready line to $tmp/ready), read its address into $addr.
start_master() {
    rm -f "$tmp/ready"
    mkfifo "$tmp/ready"
    "$KVPOOL_MASTER_BIN" --ready-fd 3 "$@" 3>"$tmp/ready" 2>"$tmp/master.log" &
    mpid=$!
    addr=$(read_ready "$tmp/ready") || fail "master with $* reports ready" "$tmp/master.log"
}

stop_master() {
    local rc=0
    stop "$mpid" || rc=$?
    mpid=""
    [[ $rc -eq 0 ]] || fail "$1: master exits 0 on SIGTERM (exit $rc)" "$tmp/master.log"
}

# Run the master to its exit with args "$@" (one that never listens); sets $rc, $tmp/out, $tmp/err.
run_master() {
    rc=0
    "$KVPOOL_MASTER_BIN" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null || rc=$?
}

# ---- a setting from the file takes effect --------------------------------------

conf="$tmp/kvpool.conf"
cat >"$conf" <<'EOF'
# kvpool settings for both daemons
log-level = warn
lease-ttl = 2

[serve]
listen = 127.0.0.3:1
no-such-serve-flag = 1

[master]
  listen   =   127.0.0.2:0   ; inline comment
lease-on-exist = yes
EOF

start_master --config "$conf"
[[ "$addr" =~ ^127\.0\.0\.2:[0-9]+$ ]] ||
    fail "the file's [master] listen = 127.0.0.2:0 is used (ready line '$addr')" "$tmp/master.log"
[[ "$addr" != "127.0.0.2:0" ]] || fail "the ready line has the bound port (got '$addr')"
stop_master "--config FILE"
ok "--config FILE: [master] listen from the file, [serve] skipped ($addr)"

start_master --config="$conf"
[[ "$addr" =~ ^127\.0\.0\.2:[0-9]+$ ]] ||
    fail "--config=FILE: the file's listen is used (ready line '$addr')" "$tmp/master.log"
stop_master "--config=FILE"
ok "--config=FILE form ($addr)"

# ---- the command line overrides the file -------------------------------------

start_master --listen 127.0.0.1:0 --config "$conf"
[[ "$addr" =~ ^127\.0\.0\.1:[0-9]+$ ]] ||
    fail "--listen before --config overrides the file (ready line '$addr')" "$tmp/master.log"
stop_master "--listen, then --config"
start_master --config "$conf" --listen 127.0.0.1:0
[[ "$addr" =~ ^127\.0\.0\.1:[0-9]+$ ]] ||
    fail "--listen after --config overrides the file (ready line '$addr')" "$tmp/master.log"
stop_master "--config, then --listen"
ok "a command-line --listen overrides the file's, before or after --config"

# ---- errors in the file: exit 2, FILE:LINE -----------------------------------

bad="$tmp/bad.conf"
printf '[master]\nlisten = 127.0.0.1:0\n\nbogus-key = 1\n' >"$bad"
run_master --config "$bad" --listen 127.0.0.1:0
[[ $rc -eq 2 ]] || fail "an unknown key exits 2 (exit $rc)" "$tmp/err"
want="kvpool-master: $bad:4: unknown key 'bogus-key' (not a flag of this program)"
[[ "$(cat "$tmp/err")" == "$want" ]] || fail "an unknown key is reported as '$want'" "$tmp/err"
[[ ! -s "$tmp/out" ]] || fail "an unknown key prints nothing on stdout" "$tmp/out"
ok "an unknown key: exit 2, FILE:LINE on stderr"

printf 'listen = 127.0.0.1:0\nno-eviction = perhaps\n' >"$bad"
run_master --config "$bad"
[[ $rc -eq 2 ]] || fail "a bad boolean exits 2 (exit $rc)" "$tmp/err"
grep -qF "kvpool-master: $bad:2: 'no-eviction' is a switch" "$tmp/err" ||
    fail "a bad boolean is reported with FILE:LINE" "$tmp/err"
ok "a bad boolean: exit 2, FILE:LINE"

printf 'listen = 127.0.0.1:0\nlease-ttl = soon\n' >"$bad"
run_master --config "$bad"
[[ $rc -eq 2 ]] || fail "a bad value for a setting exits 2 (exit $rc)" "$tmp/err"
grep -qF "soon" "$tmp/err" || fail "a bad value is named in the message" "$tmp/err"
ok "a bad value for a known key: exit 2"

run_master --config "$tmp/no-such.conf" --listen 127.0.0.1:0
[[ $rc -eq 2 ]] || fail "a missing file exits 2 (exit $rc)" "$tmp/err"
grep -qF "kvpool-master: cannot open config file $tmp/no-such.conf" "$tmp/err" ||
    fail "a missing file is named" "$tmp/err"
ok "a missing config file: exit 2"

run_master --config "$conf" --config "$conf"
[[ $rc -eq 2 ]] || fail "--config twice exits 2 (exit $rc)" "$tmp/err"
grep -qF "given twice" "$tmp/err" || fail "--config twice says so" "$tmp/err"
run_master --listen 127.0.0.1:0 --config
[[ $rc -eq 2 ]] || fail "--config without a file exits 2 (exit $rc)" "$tmp/err"
grep -qF "kvpool-master: --config needs a file name" "$tmp/err" ||
    fail "--config without a file says so" "$tmp/err"
ok "--config twice or without a file: exit 2"

# ---- --help -------------------------------------------------------------------

run_master --help
[[ $rc -eq 0 ]] || fail "--help exits 0 (exit $rc)" "$tmp/err"
grep -q -- "--config FILE" "$tmp/out" || fail "--help documents --config FILE" "$tmp/out"
ok "--help exits 0 and documents --config"

run_master --config "$conf" --help
[[ $rc -eq 0 ]] || fail "--config FILE --help exits 0 (exit $rc)" "$tmp/err"
grep -q -- "usage: kvpool-master" "$tmp/out" || fail "--config FILE --help prints usage" "$tmp/out"
ok "--help with a config file"

echo "1..$n"
