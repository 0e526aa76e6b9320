# lib.sh - what the shell tests share (sourced by test_cli.sh, test_master_config.sh):
# TAP-like "ok N - what" / "not ok N - what" lines, reading a child's --ready-fd line
# from a fifo, and a bounded SIGTERM of a child by its PID. The caller sets n=0.

ok() {
    n=$((n + 1))
    echo "ok $n - $1"
}

# "not ok", the first 4000 bytes of each non-empty file named after the message, exit 1.
fail() {
    n=$((n + 1))
    echo "not ok $n - $1" >&2
    shift
    for f in "$@"; do
        if [[ -s "$f" ]]; then
            echo "--- $f:" >&2
            head -c 4000 "$f" >&2
        fi
    done
    exit 1
}

# Read the ready line a child writes on fd 3 into fifo $1 (its EOF if it dies first).
read_ready() {
    local line=""
    if ! IFS= read -r -t 10 line <"$1"; then
        return 1
    fi
    printf '%s' "$line"
}

# SIGTERM pid $1 and wait for it (bounded: SIGKILL after 10 s); returns its exit status.
# The caller's EXIT trap must do nothing unless [[ $BASHPID == $$ ]]: the watchdog
# subshell inherits it until its first line runs.
stop() {
    local pid=$1 rc=0 wd
    kill -TERM "$pid"
    # the watchdog kills only if the process outlives the bound; its own sleep is its child
    (
        trap - EXIT # never the script's cleanup in here
        sleep 10 &
        s=$!
        trap 'kill "$s" 2>/dev/null; exit 0' TERM
        wait "$s"
        kill -KILL "$pid" 2>/dev/null
    ) >/dev/null 2>&1 &
    wd=$!
    wait "$pid" || rc=$?
    kill -TERM "$wd" 2>/dev/null || true
    wait "$wd" 2>/dev/null || true
    return "$rc"
}
