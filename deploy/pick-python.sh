#!/usr/bin/env bash
# Print the first python3 that imports pytest, numpy and the module built in BUILD
# (kvpool, mooncake.store from BUILD/client/python); exit 1 with a message when none does.
# A pyenv python3 without pytest falls back to Debian's /usr/bin/python3.
#   deploy/pick-python.sh BUILD
dir=${1:?usage: deploy/pick-python.sh BUILD}
for cand in python3 /usr/bin/python3; do
  if PYTHONPATH=$dir/client/python "$cand" -c 'import pytest, numpy, kvpool, mooncake.store' \
      >/dev/null 2>&1; then
    echo "$cand"
    exit 0
  fi
done
echo "no python3 imports pytest, numpy and $dir/client/python (deploy/install-deps.sh)" >&2
exit 1
