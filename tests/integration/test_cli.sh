#!/usr/bin/env bash
# test_cli.sh - the kvpool command-line tool end to end against a real
# kvpool-master and a real `kvpool serve`, both on 127.0.0.1.
#
# Needs $KVPOOL_MASTER_BIN and $KVPOOL_CLI_BIN. Readiness comes from
# --ready-fd 3 written into a fifo (no sleeps, no log scraping); every child
# is killed by the PID we started it with and reaped; master and serve must
# exit 0 on SIGTERM. Prints "ok N - what" per check, stops at the first
# failure with "not ok N - what" and a non-zero exit.
set -euo pipefail

: "${KVPOOL_MASTER_BIN:?set KVPOOL_MASTER_BIN to the kvpool-master binary}"
: "${KVPOOL_CLI_BIN:?set KVPOOL_CLI_BIN to the kvpool binary}"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-cli-test.XXXXXX")
mpid=""
spid=""
s2pid=""
wpid=""
n=0

cleanup() {
    local rc=$?
    # a subshell (stop()'s watchdog) killed before its `trap - EXIT` ran inherits this trap:
    # only the script itself cleans up
    if [[ "$BASHPID" != "$$" ]]; then
        exit "$rc"
    fi
    for pid in "$wpid" "$s2pid" "$spid" "$mpid"; do
        if [[ -n "$pid" ]]; then
            kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT

# ok, fail, read_ready, stop
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

# Run the CLI, capturing stdout and stderr into $tmp/out and $tmp/err; sets $rc.
cli() {
    rc=0
    "$KVPOOL_CLI_BIN" --master "$addr" --timeout-ms 5000 "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
}

# ---- start the master and a segment server ----------------------------------

mkfifo "$tmp/master.ready" "$tmp/serve.ready"

"$KVPOOL_MASTER_BIN" --listen 127.0.0.1:0 --ready-fd 3 --log-level warn --lease-ttl 0 \
    3>"$tmp/master.ready" 2>"$tmp/master.log" &
mpid=$!
addr=$(read_ready "$tmp/master.ready") || fail "master reports ready" "$tmp/master.log"
[[ "$addr" =~ ^127\.0\.0\.1:[0-9]+$ ]] || fail "master ready line is HOST:PORT (got '$addr')"
ok "master listening on $addr"

"$KVPOOL_CLI_BIN" --master "$addr" serve --segment-size 64MiB --ready-fd 3 \
    3>"$tmp/serve.ready" >"$tmp/serve.out" 2>"$tmp/serve.log" &
spid=$!
segname=$(read_ready "$tmp/serve.ready") || fail "serve reports ready" "$tmp/serve.log"
[[ -n "$segname" ]] || fail "serve ready line names the segment"
ok "serve mounted segment $segname"

# ---- put / get ---------------------------------------------------------------

head -c $((3 << 20)) /dev/urandom >"$tmp/big"
printf 'hello from stdin\n\0binary\xff\xfe tail' >"$tmp/small"

cli put big/key "$tmp/big"
[[ $rc -eq 0 ]] || fail "put a 3 MiB file (exit $rc)" "$tmp/err"
ok "put a 3 MiB file"

rc=0
"$KVPOOL_CLI_BIN" --master "$addr" put small/key - <"$tmp/small" >"$tmp/out" 2>"$tmp/err" || rc=$?
[[ $rc -eq 0 ]] || fail "put from stdin (exit $rc)" "$tmp/err"
ok "put from stdin"

cli get big/key "$tmp/big.out"
[[ $rc -eq 0 ]] || fail "get to a file (exit $rc)" "$tmp/err"
cmp "$tmp/big" "$tmp/big.out" || fail "get to a file returns the bytes put"
[[ ! -s "$tmp/out" ]] || fail "get to a file writes nothing on stdout" "$tmp/out"
ok "get to a file, byte-exact"

cli get small/key
[[ $rc -eq 0 ]] || fail "get to stdout (exit $rc)" "$tmp/err"
cmp "$tmp/small" "$tmp/out" || fail "get to stdout returns the bytes put"
ok "get to stdout, byte-exact"

cli get big/key -
[[ $rc -eq 0 ]] || fail "get to '-' (exit $rc)" "$tmp/err"
cmp "$tmp/big" "$tmp/out" || fail "get to '-' returns the bytes put"
ok "get to '-', byte-exact"

# ---- exist ---------------------------------------------------------------------

cli exist big/key small/key
[[ $rc -eq 0 ]] || fail "exist with every key present exits 0 (exit $rc)" "$tmp/err"
[[ "$(cat "$tmp/out")" == "$(printf 'big/key\tyes\nsmall/key\tyes')" ]] ||
    fail "exist prints KEY<TAB>yes per key" "$tmp/out"
ok "exist: all present, exit 0"

cli exist big/key no/such/key small/key
[[ $rc -eq 1 ]] || fail "exist with a missing key exits 1 (exit $rc)" "$tmp/err"
[[ "$(cat "$tmp/out")" == "$(printf 'big/key\tyes\nno/such/key\tno\nsmall/key\tyes')" ]] ||
    fail "exist prints KEY<TAB>no for the missing key, in order" "$tmp/out"
ok "exist: one missing, exit 1"

# ---- rm ----------------------------------------------------------------------

cli rm small/key
[[ $rc -eq 0 ]] || fail "rm (exit $rc)" "$tmp/err"
ok "rm"

cli get small/key "$tmp/small.out"
[[ $rc -eq 1 ]] || fail "get of a removed key exits 1 (exit $rc)" "$tmp/err"
[[ -s "$tmp/err" ]] || fail "get of a removed key says why on stderr"
[[ ! -e "$tmp/small.out" ]] || fail "get of a removed key leaves no output file"
[[ -z "$(find "$tmp" -name '*.kvpool-*')" ]] || fail "get of a removed key leaves no temp file"
ok "get of a removed key fails: exit 1, message, no file"

cli exist small/key
[[ $rc -eq 1 ]] || fail "exist of a removed key exits 1 (exit $rc)" "$tmp/out" "$tmp/err"
ok "exist of a removed key exits 1"

cli rm small/key
[[ $rc -eq 1 ]] || fail "rm of a missing key exits 1 (exit $rc)" "$tmp/err"
[[ -s "$tmp/err" ]] || fail "rm of a missing key says why on stderr"
ok "rm of a missing key fails"

# ---- refused puts --------------------------------------------------------------

head -c 1000 /dev/urandom >"$tmp/other"
cli put big/key "$tmp/other"
[[ $rc -eq 1 ]] || fail "put of an existing key exits 1 (exit $rc)" "$tmp/err"
[[ -s "$tmp/err" ]] || fail "put of an existing key says why on stderr"
cli get big/key "$tmp/big.out2"
[[ $rc -eq 0 ]] || fail "get after a refused put (exit $rc)" "$tmp/err"
cmp -s "$tmp/big" "$tmp/big.out2" || fail "a refused put leaves the object unchanged"
ok "put of an existing key fails, object unchanged"

: >"$tmp/empty"
cli put empty/key "$tmp/empty"
[[ $rc -eq 1 ]] || fail "put of an empty file exits 1 (exit $rc)" "$tmp/err"
[[ -s "$tmp/err" ]] || fail "put of an empty file says why on stderr"
rc=0
"$KVPOOL_CLI_BIN" --master "$addr" put empty/key - </dev/null >"$tmp/out" 2>"$tmp/err" || rc=$?
[[ $rc -eq 1 ]] || fail "put of an empty stdin exits 1 (exit $rc)" "$tmp/err"
cli exist empty/key
[[ $rc -eq 1 ]] || fail "a refused empty put stores nothing" "$tmp/out"
ok "put of an empty file or stdin fails"

cli put missing/key "$tmp/does-not-exist"
[[ $rc -ne 0 ]] || fail "put of a missing file fails"
[[ -s "$tmp/err" ]] || fail "put of a missing file says why on stderr"
ok "put of a missing file fails"

# ---- stat ------------------------------------------------------------------------

cli stat --json
[[ $rc -eq 0 ]] || fail "stat --json (exit $rc)" "$tmp/err"
json=$(cat "$tmp/out")
[[ "$json" == \{*\} ]] || fail "stat --json prints one JSON object" "$tmp/out"
[[ $(grep -o '"endpoint":' <<<"$json" | wc -l) -eq 1 ]] ||
    fail "stat --json lists exactly one segment" "$tmp/out"
grep -qF "\"name\":\"$segname\"" <<<"$json" || fail "stat --json names segment $segname" "$tmp/out"
grep -qF '"capacity":67108864,' <<<"$json" || fail "stat --json capacity is 64 MiB" "$tmp/out"
grep -qF '"objects":1,' <<<"$json" || fail "stat --json counts 1 object" "$tmp/out"
grep -qF '"pending":0,' <<<"$json" || fail "stat --json counts 0 pending" "$tmp/out"
ok "stat --json: one segment, one object"

cli stat
[[ $rc -eq 0 ]] || fail "stat (exit $rc)" "$tmp/err"
grep -qE '^segments +1$' "$tmp/out" || fail "stat shows 1 segment" "$tmp/out"
grep -qF "$segname" "$tmp/out" || fail "stat lists the segment by name" "$tmp/out"
ok "stat table: one segment"

cli rm big/key
[[ $rc -eq 0 ]] || fail "rm the last key (exit $rc)" "$tmp/err"
cli stat --json
grep -qF '"used":0,"objects":0,"pending":0' "$tmp/out" || fail "the pool is empty after rm" "$tmp/out"
ok "pool empty after removing everything"

# ---- ls, upsert, rm --regex / --all, drain ---------------------------------------

printf 'one' >"$tmp/v1"
printf 'a second value' >"$tmp/v2"
for k in ls/a1 ls/a2 ls/b1; do
    cli put "$k" "$tmp/v1"
    [[ $rc -eq 0 ]] || fail "put $k (exit $rc)" "$tmp/err"
done
cli ls '^ls/a'
[[ $rc -eq 0 ]] || fail "ls (exit $rc)" "$tmp/err"
[[ $(grep -cE ' ls/a[12]$' "$tmp/out") -eq 2 ]] || fail "ls '^ls/a' lists ls/a1 and ls/a2" "$tmp/out"
! grep -qF 'ls/b1' "$tmp/out" || fail "ls '^ls/a' does not list ls/b1" "$tmp/out"
cli ls --json --limit 1 '^ls/'
[[ $rc -eq 0 ]] || fail "ls --json --limit 1 (exit $rc)" "$tmp/err"
[[ $(grep -o '"key":' "$tmp/out" | wc -l) -eq 1 ]] || fail "--limit 1 lists one key" "$tmp/out"
grep -qF '"size":3,' "$tmp/out" || fail "ls --json gives the size" "$tmp/out"
grep -qF 'more match' "$tmp/err" || fail "ls says when more keys match than shown" "$tmp/err"
ok "ls filters by regex, bounds its output, prints JSON"

cli put ls/a1 "$tmp/v2"
[[ $rc -eq 1 ]] || fail "put of an existing key fails (exit $rc)" "$tmp/err"
cli put --upsert ls/a1 "$tmp/v2"
[[ $rc -eq 0 ]] || fail "put --upsert replaces it (exit $rc)" "$tmp/err"
cli get ls/a1 "$tmp/got"
cmp -s "$tmp/got" "$tmp/v2" || fail "get after upsert returns the new bytes" "$tmp/got"
ok "put --upsert replaces an existing key"

cli rm --regex '^ls/a'
[[ $rc -eq 0 ]] || fail "rm --regex (exit $rc)" "$tmp/err"
grep -qF 'removed 2 objects' "$tmp/out" || fail "rm --regex removes 2" "$tmp/out"
cli rm --regex '('
[[ $rc -eq 1 ]] || fail "rm --regex with a bad regex fails (exit $rc)" "$tmp/err"
cli rm --regex ''
[[ $rc -eq 2 ]] || fail "rm --regex '' is a usage error (exit $rc)" "$tmp/err"
cli rm --all
[[ $rc -eq 0 ]] || fail "rm --all (exit $rc)" "$tmp/err"
grep -qF 'removed 1 objects' "$tmp/out" || fail "rm --all removes the last one" "$tmp/out"
cli exist ls/b1
[[ $rc -eq 1 ]] || fail "ls/b1 is gone after rm --all (exit $rc)" "$tmp/out"
ok "rm --regex and rm --all"

cli drain no-such-segment
[[ $rc -eq 1 ]] || fail "drain of an unknown segment fails (exit $rc)" "$tmp/err"
grep -qF 'segment is gone' "$tmp/err" || fail "drain says why" "$tmp/err"
ok "drain of an unknown segment fails with a reason"

# ---- progress: plain lines when stderr is not a terminal -------------------------

head -c $((40 << 20)) /dev/urandom >"$tmp/large"
cli put large/key "$tmp/large"
[[ $rc -eq 0 ]] || fail "put a 40 MiB file (exit $rc)" "$tmp/err"
grep -qE '^kvpool: put large/key: .*started$' "$tmp/err" ||
    fail "a large put says it started, in a plain line" "$tmp/err"
grep -qE '^kvpool: put large/key: 40\.0 MiB of 40\.0 MiB \(100%\).*: done$' "$tmp/err" ||
    fail "a large put ends with a 100% line" "$tmp/err"
! grep -q $'\r' "$tmp/err" || fail "no carriage returns when stderr is not a terminal" "$tmp/err"
ok "put of a large file reports progress in plain lines"

cli get large/key "$tmp/large.out"
[[ $rc -eq 0 ]] || fail "get a 40 MiB object (exit $rc)" "$tmp/err"
cmp -s "$tmp/large" "$tmp/large.out" || fail "get of the large object returns its bytes"
grep -qE '^kvpool: get large/key: 40\.0 MiB of 40\.0 MiB \(100%\).*: done$' "$tmp/err" ||
    fail "a large get reports the transfer" "$tmp/err"
grep -qE "^kvpool: write $tmp/large.out: 40\.0 MiB of 40\.0 MiB \(100%\).*: done\$" "$tmp/err" ||
    fail "a large get reports writing the file" "$tmp/err"
ok "get of a large file reports progress in plain lines"

cli --no-progress get large/key "$tmp/large.out2"
[[ $rc -eq 0 && ! -s "$tmp/err" ]] || fail "--no-progress: nothing on stderr (exit $rc)" "$tmp/err"
cli put small/again "$tmp/v1"
[[ $rc -eq 0 && ! -s "$tmp/err" ]] || fail "a small put reports no progress (exit $rc)" "$tmp/err"
cli --progress rm large/key small/again
[[ $rc -eq 0 ]] || fail "rm --progress (exit $rc)" "$tmp/err"
grep -qE '^kvpool: rm: 2 keys of 2 keys \(100%\).*: done$' "$tmp/err" ||
    fail "rm with --progress reports the keys removed" "$tmp/err"
ok "--no-progress and --progress; small work reports nothing"

# ---- drain with progress: a second segment moved onto the first ---------------------

mkfifo "$tmp/serve2.ready"
"$KVPOOL_CLI_BIN" --master "$addr" serve --segment-size 16MiB --name seg-two --ready-fd 3 \
    3>"$tmp/serve2.ready" >"$tmp/serve2.out" 2>"$tmp/serve2.log" &
s2pid=$!
[[ "$(read_ready "$tmp/serve2.ready")" == seg-two ]] || fail "second serve ready" "$tmp/serve2.log"
for i in 1 2 3 4 5; do
    cli put --prefer seg-two "drain/$i" "$tmp/big"
    [[ $rc -eq 0 ]] || fail "put drain/$i on seg-two (exit $rc)" "$tmp/err"
done
cli --progress drain --wait 20 seg-two
[[ $rc -eq 0 ]] || fail "drain seg-two (exit $rc)" "$tmp/err" "$tmp/serve2.log"
grep -qE '^kvpool: drain seg-two: .*started$' "$tmp/err" || fail "drain progress starts" "$tmp/err"
grep -qE '^kvpool: drain seg-two: 5 replicas of 5 replicas \(100%\).*: unmounted$' \
    "$tmp/err" || fail "drain progress ends at 5 of 5" "$tmp/err"
wrc=0
wait "$s2pid" || wrc=$?
s2pid=""
[[ $wrc -eq 0 ]] || fail "the drained serve exits 0 (exit $wrc)" "$tmp/serve2.log"
for i in 1 2 3 4 5; do
    cli get "drain/$i" "$tmp/drained"
    cmp -s "$tmp/big" "$tmp/drained" || fail "drain/$i readable after the drain" "$tmp/err"
done
cli rm --regex '^drain/'
ok "drain reports replicas moved, objects survive"

# ---- serve --segment-file: the segment is a range of a file --------------------------

head -c $((4 << 20)) /dev/zero >"$tmp/segfile"
head -c $((4 << 20)) /dev/zero >>"$tmp/segfile" # 4 MiB before the range, 4 MiB of range
chmod 644 "$tmp/segfile"
"$KVPOOL_CLI_BIN" --master "$addr" serve --segment-size 4MiB --segment-file "$tmp/segfile" \
    --segment-file-offset 4MiB --name seg-file >"$tmp/out" 2>"$tmp/err" && rc=0 || rc=$?
[[ $rc -eq 1 ]] || fail "serve refuses a segment file others may read (exit $rc)" "$tmp/err"
grep -qF "mode 0600" "$tmp/err" || fail "the refusal says the file must be mode 0600" "$tmp/err"
cli serve --segment-file-offset 4KiB --segment-size 4MiB
[[ $rc -eq 2 ]] || fail "--segment-file-offset alone is a usage error (exit $rc)" "$tmp/err"
chmod 600 "$tmp/segfile"
mkfifo "$tmp/serve3.ready"
"$KVPOOL_CLI_BIN" --master "$addr" serve --segment-size 4MiB --segment-file "$tmp/segfile" \
    --segment-file-offset 4MiB --name seg-file --ready-fd 3 \
    3>"$tmp/serve3.ready" >"$tmp/serve3.out" 2>"$tmp/serve3.log" &
s2pid=$!
[[ "$(read_ready "$tmp/serve3.ready")" == seg-file ]] || fail "serve of a file ready" "$tmp/serve3.log"
head -c $((1 << 20)) /dev/urandom >"$tmp/onfile"
cli put --prefer seg-file file/obj "$tmp/onfile"
[[ $rc -eq 0 ]] || fail "put on the file's segment (exit $rc)" "$tmp/err"
python3 - "$tmp/segfile" "$tmp/onfile" <<'PY' || fail "the object's bytes are in the file's range"
import sys
data, obj = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
at = data.find(obj)
sys.exit(0 if at >= 4 << 20 and data[: 4 << 20] == bytes(4 << 20) else 1)
PY
rc=0
stop "$s2pid" || rc=$?
s2pid=""
[[ $rc -eq 0 ]] || fail "serve of a file exits 0 on SIGTERM (exit $rc)" "$tmp/serve3.log"
cli get file/obj "$tmp/onfile.out"
cmp -s "$tmp/onfile" "$tmp/onfile.out" || fail "the object was drained off the file's segment"
cli rm file/obj
ok "serve --segment-file: the objects in the file's range, refused when others may read it"

# ---- stat --watch --------------------------------------------------------------------

"$KVPOOL_CLI_BIN" --master "$addr" stat --watch 0.5 >"$tmp/watch.out" 2>"$tmp/watch.err" &
wpid=$!
sleep 2 # let it redraw a few times
kill -INT "$wpid"
wrc=0
wait "$wpid" || wrc=$?
wpid=""
[[ $wrc -eq 0 ]] || fail "stat --watch exits 0 on SIGINT (exit $wrc)" "$tmp/watch.err"
[[ $(grep -c '^capacity ' "$tmp/watch.out") -ge 2 ]] ||
    fail "stat --watch printed at least two blocks" "$tmp/watch.out"
[[ $(grep -c '^--- .*every 0\.5 s' "$tmp/watch.out") -ge 2 ]] ||
    fail "each block starts with a timestamp line" "$tmp/watch.out"
! grep -q $'\033' "$tmp/watch.out" || fail "no escape codes when stdout is not a terminal"
cli stat --watch=abc
[[ $rc -eq 2 ]] || fail "stat --watch=abc is a usage error (exit $rc)" "$tmp/err"
ok "stat --watch: repeated blocks until SIGINT"

# ---- usage errors exit 2 ------------------------------------------------------

cli get
[[ $rc -eq 2 ]] || fail "get without a key is a usage error (exit $rc)" "$tmp/err"
cli no-such-command
[[ $rc -eq 2 ]] || fail "an unknown command is a usage error (exit $rc)" "$tmp/err"
ok "usage errors exit 2"

# ---- shutdown --------------------------------------------------------------------

rc=0
stop "$spid" || rc=$?
spid=""
[[ $rc -eq 0 ]] || fail "serve exits 0 on SIGTERM (exit $rc)" "$tmp/serve.log"
ok "serve exits 0 on SIGTERM"

cli stat --json
[[ $rc -eq 0 ]] || fail "stat after serve stopped (exit $rc)" "$tmp/err"
grep -qF '"segments":[]' "$tmp/out" || fail "the segment is gone once serve stopped" "$tmp/out"
ok "segment unmounted when serve stops"

rc=0
stop "$mpid" || rc=$?
mpid=""
[[ $rc -eq 0 ]] || fail "master exits 0 on SIGTERM (exit $rc)" "$tmp/master.log"
ok "master exits 0 on SIGTERM"

cli get big/key "$tmp/nomaster.out"
[[ $rc -ne 0 ]] || fail "get with the master down fails"
[[ $rc -ne 2 ]] || fail "get with the master down is not a usage error" "$tmp/err"
[[ -s "$tmp/err" ]] || fail "get with the master down says why on stderr"
grep -qF "$addr" "$tmp/err" || fail "the message names the master address" "$tmp/err"
[[ ! -e "$tmp/nomaster.out" ]] || fail "get with the master down leaves no output file"
ok "get with the master down fails with a message (exit $rc)"

echo "1..$n"
