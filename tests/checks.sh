# tests/checks.sh: what the shell check scripts share (tests/pip/test_pip.sh,
# tests/deploy/test_deploy.sh). Sourced from the repository root, after the script has
# made its temporary directory $tmp:
#
#   . tests/checks.sh
#   check NAME FUNCTION   run FUNCTION with its output in $tmp/NAME.log; print one line,
#                         "NAME: OK (N s)" plus $note when set (then cleared), or the
#                         log's last $check_tail lines (default 40) and "NAME: FAIL";
#                         counts into $passed / $failed
#   copy_tree DEST        copy this tree to DEST (an existing directory): in a git
#                         checkout the tracked and untracked-but-not-ignored files as
#                         they are in the working tree (what a clean clone holds), else
#                         everything but build directories (build*, obj-*) and .git
#   checks_done           print "N passed, N failed"; its status is 0 when none failed
# shellcheck shell=bash

passed=0
failed=0
note=""

check() { # NAME FUNCTION
  # shellcheck disable=SC2154 # $tmp is the sourcing script's
  local name=$1 fn=$2 log="$tmp/$1.log" t0=$SECONDS
  if "$fn" >"$log" 2>&1; then
    echo "$name: OK ($((SECONDS - t0)) s)${note:+ $note}"
    passed=$((passed + 1))
  else
    sed 's/^/    /' "$log" | tail -"${check_tail:-40}"
    echo "$name: FAIL"
    failed=$((failed + 1))
  fi
  note=""
}

copy_tree() { # DEST
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard |
      tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$1"
  else
    tar --exclude='./build*' --exclude='./obj-*' --exclude=./.git -cf - . | tar -xf - -C "$1"
  fi
}

checks_done() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
