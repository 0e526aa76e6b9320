#!/usr/bin/env bash
# tests/deploy/test_deploy.sh: the deploy/ and packaging checks (issue 15,
# "Operations"). One line per check ("NAME: OK" / "NAME: FAIL ..."), then
# "N passed, N failed"; exits non-zero if any failed.
#
#   tests/deploy/test_deploy.sh [--no-install]
#
# Checks:
#   grafana           deploy/grafana/kvpool-dashboard.json is a Grafana dashboard
#                     model, matches make-dashboard.py, and its PromQL parses (promtool)
#   k8s-structure     deploy/k8s parses (python3-yaml) and passes check_manifests.py
#   k8s-dry-run       kubectl apply --dry-run=client of deploy/k8s (against the
#                     stand-in API server fake_apiserver.py: no cluster needed)
#   systemd-verify    systemd-analyze verify of deploy/systemd's units (their
#                     /usr/bin programs stood in for by no-op scripts), no warning allowed
#   deb-build         dpkg-buildpackage -b in a copy of the tree (nocheck, noddebs, parallel=2)
#   deb-contents      the package holds daemons, CLI, library, headers, kvpool.pc, Python
#                     module, units, configs
#   then, as root and without --no-install:
#   deb-install       apt-get install ./kvpool_*.deb (dpkg -i where apt cannot)
#   systemd-verify-installed  systemd-analyze verify of the installed units
#   configs-flags     every key of deploy/configs and the k8s ConfigMap is a flag
#                     of the installed daemons
#   daemons-start     installed kvpool-master + kvpool serve, put/get round trip
#   daemons-config    the same started from --config files (INI, [master]/[serve])
#   units-commands    the installed units' ExecStart with the shipped configs, as
#                     user nobody (flags for loopback appended), put/get round trip
#   metrics           master and owner /metrics serve every metric the dashboard uses
#   pkgconfig-example docs/examples/kvpool-example.c built with `cc $(pkg-config --cflags
#                     --libs kvpool)` against the installed package, run: put/get, bytes equal
#   python-installed  /usr/bin/python3 imports kvpool and mooncake.store from the
#                     installed package and reads back the CLI's object
#   deb-remove        dpkg --purge (only when the test installed it)
#
# The package build never touches the checkout: the tree (git ls-files, else
# everything but build dirs) is copied to a temporary directory first.
# Tools: KUBECTL (default kubectl; Debian's kubernetes-client), systemd-analyze
# (systemd), dpkg-buildpackage (dpkg-dev, debhelper), python3-yaml, promtool
# (prometheus), curl. deploy/install-deps.sh installs them.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

install=1
for arg in "$@"; do
  case $arg in
    --no-install) install=0 ;;
    *) echo "usage: tests/deploy/test_deploy.sh [--no-install]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -ne 0 ] && install=0

PY=/usr/bin/python3
KUBECTL=${KUBECTL:-kubectl}
SYSPATH=/usr/sbin:/usr/bin:/sbin:/bin

# One run at a time per machine (dpkg, the installed package).
exec 9>/tmp/kvpool-test-deploy.lock
flock 9

tmp=$(mktemp -d /tmp/kvpool-deploy-test.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

. tests/checks.sh # check NAME FUNCTION: run it with its output in a log; print one line.

free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_file() { # file, seconds[, pid]: until the file has a line (or the process is gone)
  local i
  for ((i = 0; i < $2 * 50; i++)); do
    [ -s "$1" ] && return 0
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
      echo "process $3 exited before writing $1"
      return 1
    fi
    sleep 0.02
  done
  echo "timed out waiting for $1"
  return 1
}

# Stop a daemon we started (by PID): SIGTERM, then SIGKILL after a while.
stop_pid() {
  local p=$1 i
  kill -TERM "$p" 2>/dev/null || return 0
  for ((i = 0; i < 200; i++)); do
    kill -0 "$p" 2>/dev/null || { wait "$p" 2>/dev/null; return 0; }
    sleep 0.05
  done
  kill -KILL "$p" 2>/dev/null
  wait "$p" 2>/dev/null
}

# ------------------------------------------------------------------ grafana
t_grafana() {
  local j=deploy/grafana/kvpool-dashboard.json
  $PY deploy/grafana/make-dashboard.py >"$tmp/dash.json" || return 1
  cmp "$tmp/dash.json" "$j" || { echo "$j differs from make-dashboard.py's output"; return 1; }
  $PY - "$j" "$tmp/rules.yml" <<'EOF' || return 1
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("title", "uid", "panels", "schemaVersion", "templating"):
    assert k in d, f"no {k}"
ids, exprs = set(), []
for p in d["panels"]:
    assert p["id"] not in ids, f"duplicate panel id {p['id']}"
    ids.add(p["id"])
    g = p["gridPos"]
    assert g["x"] + g["w"] <= 24 and g["w"] > 0 and g["h"] > 0, f"panel {p['title']}: gridPos {g}"
    if p["type"] == "row":
        continue
    assert p["type"] in ("timeseries", "stat", "gauge", "bargauge", "table"), p["type"]
    assert p["targets"], f"panel {p['title']}: no targets"
    for t in p["targets"]:
        exprs.append(t["expr"])
# each expression as a recording rule, for promtool to parse
with open(sys.argv[2], "w") as f:
    f.write("groups:\n- name: dashboard\n  rules:\n")
    for i, e in enumerate(exprs):
        e = e.replace("$__rate_interval", "5m")
        f.write(f"  - record: kvpool:dashboard_expr_{i}\n    expr: {json.dumps(e)}\n")
print(f"{len(d['panels'])} panels, {len(exprs)} queries")
EOF
  if command -v promtool >/dev/null; then
    promtool check rules "$tmp/rules.yml"
  else
    echo "promtool not found (package prometheus)"; return 1
  fi
}

# ------------------------------------------------------------------ k8s
t_k8s_structure() { $PY tests/deploy/check_manifests.py deploy/k8s; }

t_k8s_dry_run() {
  command -v "$KUBECTL" >/dev/null || { echo "no $KUBECTL (Debian: kubernetes-client)"; return 1; }
  "$KUBECTL" version --client 2>&1 | head -1
  $PY tests/deploy/fake_apiserver.py "$tmp/apiserver.port" &
  local spid=$!
  pids+=("$spid")
  wait_file "$tmp/apiserver.port" 10 "$spid" || return 1
  cat >"$tmp/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "http://127.0.0.1:$(cat "$tmp/apiserver.port")"}}]
contexts: [{name: offline, context: {cluster: offline, namespace: default}}]
current-context: offline
EOF
  local rc=0 n
  HOME=$tmp KUBECONFIG=$tmp/kubeconfig timeout 60 "$KUBECTL" apply --dry-run=client \
    --validate=false -f deploy/k8s/ -f deploy/k8s/optional/ >"$tmp/kubectl.out" 2>&1 || rc=$?
  cat "$tmp/kubectl.out"
  stop_pid "$spid"
  [ "$rc" -eq 0 ] || return 1
  n=$(grep -c 'created (dry run)' "$tmp/kubectl.out")
  [ "$n" -eq "$($PY -c 'import glob,yaml; print(sum(1 for f in glob.glob("deploy/k8s/**/*.yaml", recursive=True) for d in yaml.safe_load_all(open(f)) if d))')" ] ||
    { echo "kubectl created $n objects, not every document"; return 1; }
}

# ------------------------------------------------------------------ systemd
units=(kvpool-master.service kvpool-serve@.service kvpool-indexer.service)

verify_units() { # dir with the units; instance units are verified as @default
  local dir=$1 u out rc=0
  for u in "${units[@]}"; do
    local f=$dir/$u
    if [[ $u == *@.service ]]; then
      cp "$f" "$tmp/${u/@./@default.}" && f=$tmp/${u/@./@default.}
    fi
    out=$(cd "$(dirname "$f")" && SYSTEMD_LOG_COLOR=0 systemd-analyze verify "./$(basename "$f")" 2>&1) || rc=1
    # verify warns (exit 0) about unknown keys and bad values: a warning fails too
    if [ -n "$out" ]; then echo "$u: $out"; rc=1; fi
    echo "$u: verified"
  done
  return $rc
}

t_systemd_verify() {
  command -v systemd-analyze >/dev/null || { echo "no systemd-analyze (package systemd)"; return 1; }
  mkdir -p "$tmp/units" "$tmp/standins"
  local u
  for b in kvpool-master kvpool kvpool-indexer; do printf '#!/bin/sh\nexit 0\n' >"$tmp/standins/$b"; chmod +x "$tmp/standins/$b"; done
  for u in "${units[@]}"; do
    sed "s|/usr/bin/kvpool|$tmp/standins/kvpool|g" "deploy/systemd/$u" >"$tmp/units/$u"
  done
  verify_units "$tmp/units"
}

t_systemd_verify_installed() { verify_units /lib/systemd/system; }

# ------------------------------------------------------------------ package
src=$tmp/pkg/kvpool
t_deb_build() {
  mkdir -p "$src"
  copy_tree "$src" || return 1
  rm -rf "$src/debian/kvpool" "$src/debian/tmp" "$src"/obj-*
  (cd "$src" && env PATH=$SYSPATH DEB_BUILD_OPTIONS="nocheck noddebs parallel=2" \
    dpkg-buildpackage -b -us -uc) || return 1
  ls -l "$tmp"/pkg/*.deb
  note="($(basename "$(deb)"))"
}

deb() { ls "$tmp"/pkg/kvpool_*_*.deb 2>/dev/null | head -1; }

t_deb_contents() {
  local d
  d=$(deb) && [ -n "$d" ] || { echo "no package built"; return 1; }
  dpkg-deb -c "$d" | awk '{print $6}' | sed 's|^\./|/|' >"$tmp/contents"
  dpkg-deb -I "$d" | sed -n '/Package:/,$p'
  local want rc=0
  for want in /usr/bin/kvpool-master /usr/bin/kvpool /usr/bin/kvpool-bench \
    '/usr/lib/[^/]*/libkvpool.so.0' '/usr/lib/[^/]*/libkvpool.so$' \
    /usr/include/kvpool.h /usr/include/kvpool_status.h '/usr/lib/[^/]*/pkgconfig/kvpool.pc' \
    '/usr/lib/python3[^/]*/[^/]*-packages/kvpool/__init__.py' \
    '/usr/lib/python3[^/]*/[^/]*-packages/kvpool/_kvpool[^/]*\.so' \
    '/usr/lib/python3[^/]*/[^/]*-packages/mooncake/store/__init__.py' \
    /lib/systemd/system/kvpool-master.service '/lib/systemd/system/kvpool-serve@.service' \
    /usr/bin/kvpool-indexer /lib/systemd/system/kvpool-indexer.service \
    /etc/kvpool/conductor_config.json \
    /etc/kvpool/master.conf /etc/kvpool/serve-default.conf /etc/default/kvpool \
    /usr/share/kvpool/grafana/kvpool-dashboard.json /usr/share/kvpool/k8s/30-master.yaml; do
    grep -q "^$want" "$tmp/contents" || { echo "missing: $want"; rc=1; }
  done
  return $rc
}

was_installed=0
dpkg-query -W -f='${Status}' kvpool 2>/dev/null | grep -q "install ok installed" && was_installed=1
installed_by_us=0

t_deb_install() {
  local d
  d=$(deb) && [ -n "$d" ] || { echo "no package built"; return 1; }
  cp "$d" "$tmp/kvpool.deb" && chmod 644 "$tmp/kvpool.deb" && chmod 755 "$tmp"
  # apt pulls the runtime dependencies; dpkg -i where apt has no archive to reach
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "$tmp/kvpool.deb"; then
    dpkg -i "$tmp/kvpool.deb" || return 1
  fi
  installed_by_us=$((1 - was_installed))
  dpkg-query -W -f='${Package} ${Version} ${Status}\n' kvpool
  dpkg -L kvpool | grep -E 'bin/|\.so|\.service'
}

t_configs_flags() {
  $PY tests/deploy/check_configs.py /usr/bin/kvpool-master /usr/bin/kvpool \
    deploy/configs/*.conf /etc/kvpool/master.conf /etc/kvpool/serve-default.conf \
    deploy/k8s/10-configmap.yaml
}

# Start the installed master (args...), its address in $maddr and pid in $mpid.
start_master() {
  rm -f "$tmp/maddr"
  /usr/bin/kvpool-master "$@" --ready-fd 3 3>"$tmp/maddr" >"$tmp/master.out" 2>&1 &
  mpid=$!
  pids+=("$mpid")
  wait_file "$tmp/maddr" 10 "$mpid" || { cat "$tmp/master.out"; return 1; }
  maddr=$(head -1 "$tmp/maddr")
  echo "master $mpid at $maddr"
}

# Start the installed segment owner (kvpool args before serve; serve args via $serve_args).
start_serve() {
  rm -f "$tmp/segname"
  /usr/bin/kvpool "$@" --ready-fd 3 3>"$tmp/segname" >"$tmp/serve.out" 2>&1 &
  spid=$!
  pids+=("$spid")
  wait_file "$tmp/segname" 15 "$spid" || { cat "$tmp/serve.out"; return 1; }
  echo "segment $(head -1 "$tmp/segname") served by $spid"
}

round_trip() { # master address, key
  head -c $((1 << 20)) /dev/urandom >"$tmp/obj.in"
  /usr/bin/kvpool --master "$1" put "$2" "$tmp/obj.in" || return 1
  /usr/bin/kvpool --master "$1" get "$2" "$tmp/obj.out" || return 1
  cmp "$tmp/obj.in" "$tmp/obj.out" || return 1
  /usr/bin/kvpool --master "$1" exist "$2" || return 1
  echo "put/get of 1 MiB under $2: bytes match"
}

t_daemons_start() {
  start_master --listen 127.0.0.1:0 --http-listen off || return 1
  start_serve --master "$maddr" serve --segment-size 64MiB || return 1
  round_trip "$maddr" deploy/test/flags || return 1
  /usr/bin/kvpool --master "$maddr" stat
  # kept running for python-installed; stopped there
  keep_master=$maddr keep_mpid=$mpid keep_spid=$spid
}

# docs/examples/kvpool-example.c, compiled the way a C user would against the installed
# package (pkg-config kvpool; no path of this tree), run against the installed master.
t_pkgconfig_example() {
  [ -n "${keep_master:-}" ] || { echo "no daemons (daemons-start failed)"; return 1; }
  local flags want
  flags=$(env -u PKG_CONFIG_PATH -u PKG_CONFIG_SYSROOT_DIR pkg-config --cflags --libs kvpool) || return 1
  echo "pkg-config --cflags --libs kvpool: $flags"
  want=$(sed -n '1s/^kvpool (\([^)-]*\).*/\1/p' debian/changelog)
  [ "$(pkg-config --modversion kvpool)" = "$want" ] ||
    { echo "kvpool.pc says $(pkg-config --modversion kvpool), debian/changelog $want"; return 1; }
  # shellcheck disable=SC2086 # pkg-config's flags are words
  cc -Wall -Wextra -Werror docs/examples/kvpool-example.c $flags -o "$tmp/kvpool-example" || return 1
  ldd "$tmp/kvpool-example" | grep libkvpool
  ldd "$tmp/kvpool-example" | grep -Eq '=> (/usr)?/lib/[^ ]*/libkvpool\.so\.0 ' || return 1
  "$tmp/kvpool-example" "$keep_master"
}

t_python_installed() {
  [ -n "${keep_master:-}" ] || { echo "no daemons (daemons-start failed)"; return 1; }
  (cd / && env -u PYTHONPATH -u PYTHONHOME PYTHONNOUSERSITE=1 /usr/bin/python3 -I - "$keep_master" \
    "$tmp/obj.in" <<'EOF'
import sys
import kvpool, mooncake.store
for m in (kvpool, mooncake.store):
    assert m.__file__.startswith("/usr/lib/python3"), m.__file__
    print(m.__name__, m.__file__)
with kvpool.Client(master=sys.argv[1]) as c:
    got = c.get("deploy/test/flags")
assert got == open(sys.argv[2], "rb").read(), "bytes differ"
print("kvpool.Client.get of the CLI's object: bytes match")
EOF
  )
  local rc=$?
  stop_pid "$keep_spid"
  stop_pid "$keep_mpid"
  return $rc
}

t_daemons_config() {
  local hp sp
  hp=$(free_port) sp=$(free_port)
  # one file for both daemons, as the k8s ConfigMap does
  cat >"$tmp/kvpool.conf" <<EOF
# test config: [master] for kvpool-master, [serve] for kvpool serve
[master]
log-level = info
listen = 127.0.0.1:0
http-listen = 127.0.0.1:$hp
lease-ttl = 5
[serve]
master = 127.0.0.1:1
segment-size = 64MiB
http-listen = 127.0.0.1:$sp
drain-timeout = 0
EOF
  cat "$tmp/kvpool.conf"
  start_master --config "$tmp/kvpool.conf" || return 1
  start_serve --master "$maddr" serve --config "$tmp/kvpool.conf" || return 1
  round_trip "$maddr" deploy/test/config || return 1
  # the settings were read: HTTP on the configured ports, the segment 64 MiB
  curl -fsS "http://127.0.0.1:$hp/health" || { echo "master: no HTTP on $hp (http-listen from --config)"; return 1; }
  echo
  curl -fsS "http://127.0.0.1:$sp/metrics" >"$tmp/serve.metrics" || { echo "serve: no HTTP on $sp (http-listen from --config)"; return 1; }
  curl -fsS "http://127.0.0.1:$hp/metrics" >"$tmp/master.metrics" || return 1
  grep -E '^kvpool_capacity_bytes\{tier="dram"\} (67108864|6\.7108864e\+0?7)$' "$tmp/master.metrics" ||
    { echo "master: dram capacity is not the configured 64MiB:"; grep capacity "$tmp/master.metrics"; return 1; }
  # a flag overrides the file
  stop_pid "$spid"; stop_pid "$mpid"
  start_master --config "$tmp/kvpool.conf" --http-listen off || return 1
  ! curl -fsS -m 2 "http://127.0.0.1:$hp/health" >/dev/null 2>&1 || { echo "--http-listen off did not override the file"; return 1; }
  stop_pid "$mpid"
}

t_metrics() {
  [ -s "$tmp/master.metrics" ] && [ -s "$tmp/serve.metrics" ] || { echo "no /metrics scraped (daemons-config failed)"; return 1; }
  [ -s "$tmp/indexer.metrics" ] || { echo "no indexer /metrics scraped (units-commands failed)"; return 1; }
  $PY - deploy/grafana/kvpool-dashboard.json "$tmp/master.metrics" "$tmp/serve.metrics" \
    "$tmp/indexer.metrics" <<'EOF'
import json, re, sys
d = json.load(open(sys.argv[1]))
used = set()
for p in d["panels"]:
    for t in p.get("targets", []):
        used |= set(re.findall(r"\bkvpool_[a-z0-9_]+", t["expr"]))
exposed = set()
for f in sys.argv[2:]:
    for line in open(f):
        m = re.match(r"# (?:TYPE|HELP) (kvpool_[a-z0-9_]+)", line) or re.match(r"(kvpool_[a-z0-9_]+)", line)
        if m:
            n = m.group(1)
            exposed.add(n)
            exposed.add(re.sub(r"_(bucket|sum|count)$", "", n))
for n in list(exposed):
    for suf in ("_bucket", "_sum", "_count"):
        exposed.add(n + suf)
missing = sorted(used - exposed)
print(f"{len(used)} metric names in the dashboard, {len(missing)} not exposed")
for n in missing:
    print("not exposed:", n)
sys.exit(1 if missing else 0)
EOF
}

# The installed units' ExecStart lines with the shipped configs, run as an
# unprivileged user (as DynamicUser= would), plus flags for a test on loopback
# (flags override the config file).
unit_cmd() { # unit file, instance
  sed -n 's/^ExecStart=//p' "$1" | head -1 | sed "s/%i/$2/g"
}
t_units_commands() {
  local mcmd scmd
  mcmd=$(unit_cmd /lib/systemd/system/kvpool-master.service "") || return 1
  scmd=$(unit_cmd /lib/systemd/system/kvpool-serve@.service default) || return 1
  echo "master: $mcmd"; echo "serve:  $scmd"
  [ -n "$mcmd" ] && [ -n "$scmd" ] || return 1
  local asuser=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
  rm -f "$tmp/maddr" "$tmp/segname"
  # shellcheck disable=SC2086 # the unit's command line, split as systemd does (no quotes there)
  (set -a; . /etc/default/kvpool; exec "${asuser[@]}" $mcmd --listen 127.0.0.1:0 --http-listen off \
    --ready-fd 3) 3>"$tmp/maddr" >"$tmp/master.out" 2>&1 &
  mpid=$!; pids+=("$mpid")
  wait_file "$tmp/maddr" 10 "$mpid" || { cat "$tmp/master.out"; return 1; }
  maddr=$(head -1 "$tmp/maddr")
  # shellcheck disable=SC2086
  (set -a; . /etc/default/kvpool; exec "${asuser[@]}" $scmd --master "$maddr" --segment-size 64MiB \
    --http-listen 127.0.0.1:0 --drain-timeout 0 --ready-fd 3) 3>"$tmp/segname" >"$tmp/serve.out" 2>&1 &
  spid=$!; pids+=("$spid")
  wait_file "$tmp/segname" 15 "$spid" || { cat "$tmp/serve.out"; return 1; }
  cat "$tmp/segname"
  chmod 755 "$tmp"
  round_trip "$maddr" deploy/test/units || return 1
  stop_pid "$spid"; stop_pid "$mpid"
  # the indexer's unit: its config and a state directory of its own, as systemd gives it
  local icmd iaddr
  icmd=$(unit_cmd /lib/systemd/system/kvpool-indexer.service "") || return 1
  echo "indexer: $icmd"
  mkdir -p "$tmp/istate" && chown 65534:65534 "$tmp/istate" && chmod 700 "$tmp/istate"
  rm -f "$tmp/iaddr"
  # shellcheck disable=SC2086
  (set -a; . /etc/default/kvpool; STATE_DIRECTORY=$tmp/istate
   exec "${asuser[@]}" $(eval echo "$icmd") --listen 127.0.0.1:0 --ready-fd 3) \
    3>"$tmp/iaddr" >"$tmp/indexer.out" 2>&1 &
  ipid=$!; pids+=("$ipid")
  wait_file "$tmp/iaddr" 10 "$ipid" || { cat "$tmp/indexer.out"; return 1; }
  iaddr=$(head -1 "$tmp/iaddr")
  curl -fsS "http://$iaddr/register" -d '{"endpoint": "tcp://127.0.0.1:5557", "type": "vLLM",
    "modelname": "m", "instance_id": "unit-test", "block_size": 16, "dp_rank": 0}' || return 1
  echo
  [ -s "$tmp/istate/registrations.json" ] || { echo "indexer: no state written"; return 1; }
  curl -fsS "http://$iaddr/metrics" >"$tmp/indexer.metrics" || return 1
  stop_pid "$ipid"
}

t_deb_remove() {
  dpkg --purge kvpool || return 1
  ! dpkg-query -W -f='${Status}' kvpool 2>/dev/null | grep -q "install ok installed" || return 1
  [ ! -e /usr/bin/kvpool-master ] || { echo "/usr/bin/kvpool-master left behind"; return 1; }
}

check grafana t_grafana
check k8s-structure t_k8s_structure
check k8s-dry-run t_k8s_dry_run
check systemd-verify t_systemd_verify
check deb-build t_deb_build
check deb-contents t_deb_contents
if [ "$install" = 1 ]; then
  if [ -n "$(deb)" ]; then
    check deb-install t_deb_install
    check systemd-verify-installed t_systemd_verify_installed
    check configs-flags t_configs_flags
    check daemons-start t_daemons_start
    check pkgconfig-example t_pkgconfig_example
    check python-installed t_python_installed
    check daemons-config t_daemons_config
    check units-commands t_units_commands
    check metrics t_metrics
    [ "$installed_by_us" = 1 ] && check deb-remove t_deb_remove
  else
    echo "install checks: FAIL (no package)"; failed=$((failed + 1))
  fi
else
  echo "install checks: skipped (--no-install or not root)"
fi

checks_done
