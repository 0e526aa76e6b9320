#!/usr/bin/env bash
# Fuzz the master's frame scanner and RPC handlers (tests/fuzz/fuzz_master.c), then
# kvpool-indexer's event decoder, index and JSON bodies (tests/fuzz/fuzz_indexer.c, a third
# of the time, at least 10 s), then common/json.c, the one JSON reader (tests/fuzz/fuzz_json.c,
# a sixth of the time, at least 10 s), with libFuzzer for a bounded time: clang, ASan + UBSan,
# LeakSanitizer on.
# Sets up build-fuzz/ once, builds only the fuzz targets, fuzzes from a
# temporary copy of the seed corpus (tests/fuzz/corpus is never written) and
# ends with one line "fuzz: N execs in all, 0 crashes". Exits
# non-zero on a crash, leak, timeout or out-of-memory, printing the path of
# the input that caused it (kept in the temporary directory).
#
#   deploy/fuzz.sh            60 seconds
#   deploy/fuzz.sh 300        300 seconds
#
# Reproduce a finding: build-fuzz/tests/fuzz/fuzz_master PATH
set -uo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
case "$secs" in
'' | *[!0-9]*)
  echo "usage: deploy/fuzz.sh [SECONDS]" >&2
  exit 2
  ;;
esac
dir=build-fuzz

deploy/install-deps.sh || { echo "fuzz: installing dependencies failed"; exit 1; }

mkdir -p "$dir" # logs live inside it (ignored by git)
if [ ! -f "$dir/build.ninja" ]; then
  # werror off here only: a clang-only warning elsewhere must not block fuzzing.
  if ! CC=clang meson setup "$dir" -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dwerror=false -Dc_args='-fsanitize=fuzzer-no-link -fno-sanitize-recover=all' \
    >"$dir/fuzz-setup.log" 2>&1; then
    cat "$dir/fuzz-setup.log"
    echo "fuzz: meson setup failed"
    exit 1
  fi
fi
if ! ninja -C "$dir" tests/fuzz/fuzz_master tests/fuzz/fuzz_indexer tests/fuzz/fuzz_json \
  tests/fuzz/gen_corpus \
  >"$dir/fuzz-ninja.log" 2>&1; then
  cat "$dir/fuzz-ninja.log"
  echo "fuzz: build failed"
  exit 1
fi
grep -E 'warning:' "$dir/fuzz-ninja.log" | sort -u | head -20

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# fuzz TARGET SEEDS SECONDS: one libFuzzer run; 0, or 1 with the finding shown.
total_runs=0
fuzz() {
  local target=$1 seeds=$2 t=$3 work rc runs took artifacts execs
  work=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-fuzz.XXXXXX")
  mkdir -p "$work/corpus" "$work/artifacts"
  cp "$seeds"/* "$work/corpus/"
  # New inputs go to the first directory (the copy); the committed corpus is read only.
  "$dir/tests/fuzz/$target" -max_total_time="$t" -timeout=10 -rss_limit_mb=1024 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$work/corpus" "$seeds" >"$work/fuzz.log" 2>&1
  rc=$?
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1/p' "$work/fuzz.log" | tail -1)
  took=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$work/fuzz.log" | tail -1)
  artifacts=$(ls "$work/artifacts" 2>/dev/null | wc -l)
  if [ "$rc" -eq 0 ] && [ -n "$runs" ] && [ "$artifacts" -eq 0 ]; then
    grep -E '^#[0-9]+[[:space:]]+DONE|^stat::' "$work/fuzz.log" || true
    echo "fuzz: $target: $runs execs in $took s ($((runs / (took > 0 ? took : 1))) exec/s)"
    total_runs=$((total_runs + runs))
    rm -rf "$work"
    return 0
  fi
  # A finding: show the report and where the input is.
  grep -vE '^#[0-9]+' "$work/fuzz.log" | tail -80
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -1)
  for f in "$work"/artifacts/*; do
    [ -e "$f" ] && echo "fuzz: reproducer: $f (run: $dir/tests/fuzz/$target $f)"
  done
  echo "fuzz: $target FAILED (libFuzzer exit $rc) after ${execs:-?} execs, $artifacts crash" \
    "file(s); log: $work/fuzz.log"
  return 1
}

# the master's frames and handlers for SECONDS; kvpool-indexer's decoder, index and JSON
# bodies for a third of it (at least 10 s); the JSON reader for a sixth (at least 10 s)
isecs=$((secs / 3 > 10 ? secs / 3 : 10))
jsecs=$((secs / 6 > 10 ? secs / 6 : 10))
fuzz fuzz_master tests/fuzz/corpus "$secs" || exit 1
fuzz fuzz_indexer tests/fuzz/corpus-indexer "$isecs" || exit 1
fuzz fuzz_json tests/fuzz/corpus-json "$jsecs" || exit 1
echo "fuzz: $total_runs execs in all, 0 crashes"
exit 0
