#!/usr/bin/env bash
# Make ZeroMQ CURVE key pairs for the KV events (kvpool-master
# --kv-events-curve-secret / --kv-events-curve-allow; docs/security.md,
# "KV events: CURVE"), with python3 and python3-zmq (libzmq's own
# zmq_curve_keypair, libsodium's random numbers).
#
#   deploy/make-curve-keys.sh DIR NAME...
#
# Makes in DIR, per NAME (an existing pair is kept, never overwritten):
#   NAME.key   the secret key: 40 Z85 characters and a newline, mode 0600
#              (the master's: --kv-events-curve-secret; a subscriber's: its
#              curve_secretkey)
#   NAME.pub   the public key, mode 0644 (the master's: every subscriber's
#              curve_serverkey; a subscriber's: a line of the allow-list,
#              "$(cat NAME.pub) TENANT" or "$(cat NAME.pub) *")
# Who may run it: whoever may hold the secrets; DIR is made mode 0700.
set -euo pipefail

die() { echo "make-curve-keys: $*" >&2; exit "${rc:-1}"; }
if [ $# -lt 2 ] || [ -z "$1" ] || [ "${1#-}" != "$1" ]; then
  rc=2 die "usage: deploy/make-curve-keys.sh DIR NAME..."
fi
DIR=$1; shift
for name in "$@"; do
  [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || rc=2 die "bad name '$name' ([A-Za-z0-9._-])"
done
# the first python3 with zmq (a pyenv python3 without it falls back to Debian's)
PY=
for cand in python3 /usr/bin/python3; do
  if "$cand" -c 'import zmq, sys; sys.exit(0 if zmq.has("curve") else 1)' >/dev/null 2>&1; then
    PY=$cand
    break
  fi
done
[ -n "$PY" ] || die "python3-zmq with CURVE is needed (apt-get install python3-zmq)"
mkdir -p -m 0700 "$DIR"

for name in "$@"; do
  if [ -e "$DIR/$name.key" ] || [ -e "$DIR/$name.pub" ]; then
    echo "make-curve-keys: keeping $DIR/$name.key and .pub" >&2
    continue
  fi
  # the secret goes from python straight into a file created 0600 (umask 077)
  (umask 077 && "$PY" - "$DIR/$name" <<'PY'
import os, sys, zmq
public, secret = zmq.curve_keypair()
fd = os.open(sys.argv[1] + ".key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
with os.fdopen(fd, "wb") as f:
    f.write(secret + b"\n")
fd = os.open(sys.argv[1] + ".pub", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
with os.fdopen(fd, "wb") as f:
    f.write(public + b"\n")
PY
  ) || die "cannot make $DIR/$name.key"
  chmod 0644 "$DIR/$name.pub"
  echo "make-curve-keys: made $DIR/$name.key (secret, 0600) and $DIR/$name.pub" >&2
done
