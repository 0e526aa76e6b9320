#!/usr/bin/env bash
# tests/rdma/rxe-vm.sh - kvpool's own copy of the Soft-RoCE VM tool (adopted
# from ../shared/tools/rxe-vm.sh; see ../shared/notes/softroce-vm.md). kvpool
# owns and maintains this copy; changes against the original:
#   * the image cache defaults to <repo>/build-rdma-vm (ignored by git via
#     build-*/), wherever the tool is called from;
#   * guest RAM defaults to 1024 MiB (this host slows down badly when more
#     than ~2.5 GiB is touched in total);
#   * the guest image also carries kvpool's runtime libraries (protobuf-c,
#     cmocka, xxhash, jemalloc), so host-built test binaries run unchanged.
#
# rxe-vm.sh - run real RDMA verbs code (libibverbs, rdma_cm) on a machine
# without RDMA hardware, inside a throw-away QEMU/KVM guest that has a
# Soft-RoCE (rdma_rxe) device.
#
# The host kernel needs no RDMA support and no loadable modules: the guest
# runs Debian's own kernel, which ships rdma_rxe as a module.
#
#   rxe-vm.sh build          build the guest image (kernel + initramfs rootfs)
#                            into $RXE_VM_DIR; skipped if already built
#   rxe-vm.sh run CMD...     boot the guest, share the current directory into
#                            it (same path, read-write), create Soft-RoCE
#                            device rxe0, run CMD there as root, power off,
#                            exit with CMD's exit status
#   rxe-vm.sh shell          like `run bash -i`, but on the console (debugging)
#   rxe-vm.sh info | clean   show / delete the cached image
#
# Design
#   * The guest root filesystem is a minimal Debian (same suite as the host by
#     default) made with mmdebstrap (or debootstrap) and packed, together with
#     the few kernel modules needed, into one uncompressed initramfs. There is
#     no disk image: the guest lives in RAM and starts pristine every boot.
#   * The image only contains a tiny stage-1 init that mounts a per-run 9p
#     "control" share and executes the stage-2 script written by this script
#     for that run, so changing this script never forces an image rebuild.
#   * Host directories are shared with virtio-9p. CMD's stdout and stderr come
#     back over two virtio-serial ports (streamed live), its exit status via
#     the control share. The guest kernel console goes to a log file that is
#     printed only if the guest fails.
#   * Networking is VM-internal only: by default the guest has NO network
#     card at all; rxe0 sits on a "dummy" netdev. RDMA traffic between two
#     QPs of the same guest never leaves the guest kernel.
#
# Environment (all optional)
#   RXE_VM_DIR       cache dir for the image           (default <repo>/build-rdma-vm)
#   RXE_VM_TIMEOUT   hard limit, seconds, whole run     (default 900)
#   RXE_VM_MEM       guest RAM, MiB                     (default 1024)
#   RXE_VM_CPUS      guest vCPUs                        (default: host cores, max 4)
#   RXE_VM_ACCEL     kvm | tcg | auto   (default auto: kvm only with hardware KVM,
#                    i.e. kvm_intel/kvm_amd loaded; else tcg, see pick_accel)
#   RXE_VM_NETDEV    netdev under rxe0: dummy | virtio | lo   (default dummy;
#                    lo: verbs work but rdma_cm does not)
#   RXE_VM_IP        IPv4 address/prefix given to that netdev (default 169.254.77.1/16)
#   RXE_VM_LINK      with RXE_VM_NETDEV=virtio: join the NIC to a second guest's
#                    instead of a dead-end hub port, over a TCP socket between
#                    the two QEMUs on the host's loopback: listen=127.0.0.1:PORT
#                    in one, connect=127.0.0.1:PORT in the other (two hosts on
#                    one wire; give each its own RXE_VM_IP and RXE_VM_MAC)
#   RXE_VM_MAC       the virtio NIC's MAC address        (default QEMU's)
#   RXE_VM_SHARES    extra host dirs to share, ':'-separated, mounted at the same path
#   RXE_VM_VERBOSE   1 = stream the guest console (kernel log) to stderr,
#                    2 = also full kernel log and a timed trace of the guest setup
#   RXE_VM_SUITE     Debian suite for the guest        (default: host's VERSION_CODENAME)
#   RXE_VM_MIRROR    Debian mirror        (default: the host's own apt source for the suite)
#   RXE_VM_SECURITY_MIRROR                 (default: the host's apt source for SUITE-security)
#   RXE_VM_PACKAGES  extra Debian packages for the guest (space-separated)
#   RXE_VM_NO_APT    1 = never apt-get install missing host tools
#   RXE_VM_BOOTSTRAP mmdebstrap | debootstrap           (default: mmdebstrap if present)
#   RXE_VM_KERNEL    bzimage = boot the compressed kernel instead of the PVH vmlinux
#   RXE_VM_APPEND    extra guest kernel command line
#
# Inside the guest CMD sees: RXE_VM=1, RXE_DEV=rxe0, RXE_NETDEV, RXE_IP (the
# address to bind/connect rdma_cm to), RXE_GID_INDEX (GID index of RXE_IP),
# stdin=/dev/null, cwd = the host's cwd, unlimited memlock.
#
# Exit status of `run`: CMD's status; 124 on timeout; 125 if the guest failed
# before/while running CMD (its console log is then printed to stderr).

# shellcheck disable=SC2054  # qemu option strings contain commas
set -euo pipefail

PROG=${0##*/}
die()  { echo "$PROG: error: $*" >&2; exit 125; }
note() { echo "$PROG: $*" >&2; }

# --------------------------------------------------------------- settings ---
KVP_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
RXE_VM_DIR=${RXE_VM_DIR:-$KVP_REPO/build-rdma-vm}
RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-900}
RXE_VM_MEM=${RXE_VM_MEM:-1024}
RXE_VM_ACCEL=${RXE_VM_ACCEL:-auto}
RXE_VM_NETDEV=${RXE_VM_NETDEV:-dummy}
RXE_VM_SHARES=${RXE_VM_SHARES:-}
RXE_VM_LINK=${RXE_VM_LINK:-}
RXE_VM_MAC=${RXE_VM_MAC:-}
RXE_VM_VERBOSE=${RXE_VM_VERBOSE:-0}
# host_apt_uri SUITE: the first URI the host's apt sources use for SUITE (deb822
# .sources files or one-line sources.list), so the guest is built from the same
# archive the host already reaches.
host_apt_uri() {
    local want=$1 f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        awk -v want="$want" '
            /^[[:space:]]*$/ { if (uri != "" && hit) { print uri; exit } uri = ""; hit = 0; next }
            /^URIs:/   { uri = $2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == want) hit = 1 }
            END        { if (uri != "" && hit) print uri }' "$f" | head -n 1
    done | head -n 1
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $f ]] || continue
        awk -v want="$want" '$1 == "deb" && $3 == want { print $2; exit }' "$f"
    done | head -n 1
}
RXE_VM_PACKAGES=${RXE_VM_PACKAGES:-}
RXE_VM_NO_APT=${RXE_VM_NO_APT:-0}
RXE_VM_APPEND=${RXE_VM_APPEND:-}
if [[ -z ${RXE_VM_CPUS:-} ]]; then
    RXE_VM_CPUS=$(nproc 2>/dev/null || echo 2)
    (( RXE_VM_CPUS > 4 )) && RXE_VM_CPUS=4
fi
if [[ -z ${RXE_VM_SUITE:-} ]]; then
    RXE_VM_SUITE=$( . /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}" )
    RXE_VM_SUITE=${RXE_VM_SUITE:-bookworm}
fi
RXE_VM_MIRROR=${RXE_VM_MIRROR:-$(host_apt_uri "$RXE_VM_SUITE" | head -n 1)}
RXE_VM_SECURITY_MIRROR=${RXE_VM_SECURITY_MIRROR:-$(host_apt_uri "$RXE_VM_SUITE-security" | head -n 1)}
[[ -n $RXE_VM_MIRROR ]] || { echo "${0##*/}: no apt source for $RXE_VM_SUITE found; set RXE_VM_MIRROR" >&2; exit 125; }
RXE_VM_SECURITY_MIRROR=${RXE_VM_SECURITY_MIRROR:-$RXE_VM_MIRROR}
# The netdev under rxe0 gets this address. It must NOT be a loopback
# (127/8) address: rxe and plain verbs accept one, but rdma_cm then fails with
# "rdma_resolve_route: No such device" (the route goes via lo, which has no
# RDMA device). A link-local address is used: it never leaves the guest (the
# guest has no NIC by default; rxe short-circuits traffic to its own address).
RXE_VM_IP=${RXE_VM_IP:-169.254.77.1/16}

# Guest packages: the userspace verbs stack (libibverbs1 + ibverbs-providers,
# which holds the rxe provider; librdmacm1), the usual test tools
# (ibverbs-utils: ibv_devices/ibv_rc_pingpong, rdmacm-utils: rping,
# perftest: ib_write_bw/ib_read_bw), iproute2 (`rdma` tool) and kmod.
# The "rdma-core" package itself is left out on purpose: it only carries udev
# rules, systemd units and daemons (no init runs in the guest), and it drags
# in udev and (via usrmerge) perl, ~60 MB of RAM-resident image.
# usr-is-merged satisfies init-system-helpers without pulling usrmerge+perl.
GUEST_PACKAGES="libibverbs1 ibverbs-providers librdmacm1 libibumad3
    ibverbs-utils rdmacm-utils perftest iproute2 kmod procps usr-is-merged
    libprotobuf-c1 libcmocka0 libxxhash0 libjemalloc2 liburing2 libcurl4
    libmicrohttpd12 libzmq5 libmsgpackc2 libinih1"
# (The last two lines: kvpool's runtime libraries, for host-built test binaries.)
# Kernel modules copied into the image (plus their dependencies).
GUEST_MODULES="rdma_rxe ib_uverbs ib_umad rdma_ucm rdma_cm
    crc32_generic crc32-pclmul virtio_pci virtio_console virtio_rng virtio_net
    9pnet_virtio 9p dummy veth sch_fq_codel"
IMAGE_FORMAT=3   # bump when the image layout changes

IMG_DIR="$RXE_VM_DIR/image"

# Everything that determines the image; a change triggers a rebuild.
recipe() {
    printf '%s\n' "format=$IMAGE_FORMAT" "suite=$RXE_VM_SUITE" \
        "mirror=$RXE_VM_MIRROR" "security=$RXE_VM_SECURITY_MIRROR" \
        "packages=$(echo $GUEST_PACKAGES $RXE_VM_PACKAGES)" \
        "modules=$(echo $GUEST_MODULES)"
}

image_ok() {
    [[ -s $IMG_DIR/vmlinuz && -s $IMG_DIR/initrd.img && -f $IMG_DIR/recipe ]] &&
        [[ "$(cat "$IMG_DIR/recipe")" == "$(recipe)" ]]
}

# ------------------------------------------------------------- host tools ---
# Install missing host tools with apt (Debian/Ubuntu hosts, as root).
need_host_tools() {   # need_host_tools "cmd:package" ...
    local missing=() pkgs=() spec
    for spec in "$@"; do
        command -v "${spec%%:*}" >/dev/null 2>&1 || { missing+=("${spec%%:*}"); pkgs+=("${spec#*:}"); }
    done
    (( ${#missing[@]} == 0 )) && return 0
    if [[ $RXE_VM_NO_APT == 1 || $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
        die "missing host tools: ${missing[*]} (install packages: ${pkgs[*]})"
    fi
    note "installing host packages: ${pkgs[*]}"
    # -o DPkg::Lock::Timeout: wait if another apt is running (CI images).
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq \
        install -y --no-install-recommends "${pkgs[@]}" >/dev/null ||
    { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq update >/dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq \
        install -y --no-install-recommends "${pkgs[@]}" >/dev/null; } ||
        die "apt-get install ${pkgs[*]} failed"
}

# ------------------------------------------------------------------ build ---
# Stage-1 init baked into the image: mount the per-run control share and hand
# over to the stage-2 script found there. Kept minimal and run-independent.
stage1_script() {
    cat <<'EOF'
#!/bin/sh
# rxe-vm stage-1 init (PID 1). Real work is done by /run/rxe-vm/init, which
# the host writes for every run.
PATH=/usr/sbin:/usr/bin:/sbin:/bin; export PATH
halt() { echo "rxe-vm stage1: $*" >/dev/console; echo o >/proc/sysrq-trigger; sleep 60; }
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev || halt "mount failed"
modprobe -a virtio_pci 9pnet_virtio 9p || halt "modprobe 9p failed"
mkdir -p /run/rxe-vm
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 rxe_ctl /run/rxe-vm || halt "cannot mount control share"
[ -f /run/rxe-vm/init ] || halt "no /run/rxe-vm/init"
exec /bin/bash /run/rxe-vm/init
halt "exec failed"
EOF
}

# Extract the uncompressed ELF vmlinux from a bzImage. QEMU boots such an ELF
# directly through its PVH entry point, which skips the firmware's Linux
# loader and the in-guest xz decompression (several seconds under TCG).
extract_vmlinux() {   # extract_vmlinux BZIMAGE OUT
    local in=$1 out=$2 spec tool magic off
    for spec in 'xz:\xfd7zXZ\x00' 'gzip:\x1f\x8b\x08' 'zstd:\x28\xb5\x2f\xfd'; do
        tool=${spec%%:*} magic=${spec#*:}
        command -v "$tool" >/dev/null || continue
        for off in $(LC_ALL=C grep -obUaP "$magic" "$in" | cut -d: -f1); do
            # Trailing bytes after the stream make the tool complain; the
            # ELF check below is what counts.
            tail -c +"$((off + 1))" "$in" | "$tool" -dc 2>/dev/null >"$out" || true
            [[ $(head -c 4 "$out" | od -An -c | tr -d ' ') == 177ELF ]] && return 0
        done
    done
    rm -f "$out"
    return 1
}

cmd_build() {
    if image_ok; then
        note "image already built in $IMG_DIR (use '$PROG clean' to force a rebuild)"
        return 0
    fi
    [[ $(id -u) == 0 ]] || die "build must run as root (debootstrap/chroot)"
    need_host_tools cpio:cpio xz:xz-utils qemu-system-x86_64:qemu-system-x86
    # mmdebstrap is preferred (one apt run, can include the security suite);
    # debootstrap works too. RXE_VM_BOOTSTRAP forces one.
    local bootstrap=${RXE_VM_BOOTSTRAP:-}
    if [[ -z $bootstrap ]]; then
        command -v mmdebstrap >/dev/null || command -v debootstrap >/dev/null ||
            need_host_tools mmdebstrap:mmdebstrap
        bootstrap=mmdebstrap
        command -v mmdebstrap >/dev/null || bootstrap=debootstrap
    else
        need_host_tools "$bootstrap:$bootstrap"
    fi

    local t0=$SECONDS
    mkdir -p "$RXE_VM_DIR"
    local work; work=$(mktemp -d "$RXE_VM_DIR/build.XXXXXX")
    # shellcheck disable=SC2064
    # --one-file-system: never descend into anything still mounted in there.
    trap "rm -rf --one-file-system '$work'" EXIT
    local root=$work/rootfs
    local inc; inc=$(echo $GUEST_PACKAGES $RXE_VM_PACKAGES | tr ' ' ',')

    note "bootstrapping Debian $RXE_VM_SUITE with $bootstrap (a few minutes)..."
    if [[ $bootstrap == mmdebstrap ]]; then
        # mmdebstrap resolves everything with apt in one go and can take the
        # security suite too, so the guest userland matches an updated host.
        mmdebstrap --quiet --mode=root --variant=minbase --include="$inc" \
            --aptopt='Acquire::Retries "3"' \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/info/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            "$RXE_VM_SUITE" "$root" \
            "deb $RXE_VM_MIRROR $RXE_VM_SUITE main" \
            "deb $RXE_VM_MIRROR $RXE_VM_SUITE-updates main" \
            "deb $RXE_VM_SECURITY_MIRROR $RXE_VM_SUITE-security main" \
            >"$work/bootstrap.log" 2>&1 ||
            { tail -n 30 "$work/bootstrap.log" >&2; die "mmdebstrap failed"; }
    else
        debootstrap --variant=minbase --include="$inc" "$RXE_VM_SUITE" "$root" \
            "$RXE_VM_MIRROR" >"$work/bootstrap.log" 2>&1 ||
            { tail -n 30 "$work/bootstrap.log" >&2; die "debootstrap failed"; }
    fi

    # mmdebstrap satisfies init-system-helpers' "usrmerge | usr-is-merged"
    # with usrmerge, which needs full perl (~50 MB). The guest's /usr is
    # already merged, so swap it for usr-is-merged and drop what it pulled.
    local apt=(apt-get -qq -o APT::Sandbox::User=root)
    # (Marked "auto" first so that autoremove keeps perl if a package from
    # RXE_VM_PACKAGES needs it.)
    if chroot "$root" dpkg-query -W -f='${Status}' usrmerge 2>/dev/null | grep -q 'ok installed'; then
        chroot "$root" apt-mark auto perl perl-modules-5.36 libperl5.36 libfile-find-rule-perl \
            libnumber-compare-perl libtext-glob-perl libgdbm-compat4 libgdbm6 >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive chroot "$root" "${apt[@]}" -y purge usrmerge >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive chroot "$root" "${apt[@]}" -y autoremove --purge \
            -o APT::AutoRemove::SuggestsImportant=false >/dev/null 2>&1 ||
            note "warning: could not remove usrmerge (image is just bigger)"
    fi

    # --- kernel: Debian's own (ships rdma_rxe). Downloaded with the guest's
    # apt, unpacked aside; only the modules we need go into the image.
    note "fetching the Debian kernel..."
    printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
        "$RXE_VM_MIRROR" "$RXE_VM_SUITE" "$RXE_VM_MIRROR" "$RXE_VM_SUITE" \
        "$RXE_VM_SECURITY_MIRROR" "$RXE_VM_SUITE" >"$root/etc/apt/sources.list"
    chroot "$root" "${apt[@]}" update >/dev/null || die "apt-get update in guest rootfs failed"
    local kpkg
    kpkg=$(chroot "$root" apt-cache depends linux-image-amd64 |
           awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    [[ -n $kpkg ]] || die "cannot resolve linux-image-amd64"
    mkdir -p "$root/tmp/kernel"
    (cd "$root/tmp/kernel" && chroot "$root" sh -c 'cd /tmp/kernel && exec "$@"' sh "${apt[@]}" download "$kpkg") ||
        die "cannot download $kpkg"
    dpkg-deb -x "$root"/tmp/kernel/*.deb "$root/tmp/kernel/x"
    local kver; kver=$(basename "$(ls -d "$root"/tmp/kernel/x/lib/modules/*)")
    cp "$root/tmp/kernel/x/boot/vmlinuz-$kver" "$work/vmlinuz"
    extract_vmlinux "$work/vmlinuz" "$work/vmlinux" ||
        note "warning: could not extract vmlinux; booting the bzImage (slower)"

    # Resolve module dependencies with the guest's own kmod (the host may not
    # have kmod at all), then copy just those modules.
    chroot "$root" depmod -b /tmp/kernel/x "$kver"
    # shellcheck disable=SC2086
    chroot "$root" modprobe -d /tmp/kernel/x -S "$kver" --show-depends -a $GUEST_MODULES \
        >"$work/moddeps" || die "module dependency resolution failed"
    local kmods=/tmp/kernel/x/lib/modules/$kver rel
    while read -r word path _; do
        [[ $word == insmod ]] || continue
        rel=${path#"$kmods"/}
        mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
        cp "$root$path" "$root/lib/modules/$kver/$rel"
    done <"$work/moddeps"
    cp "$root$kmods"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/"
    chroot "$root" depmod "$kver"
    rm -rf "$root/tmp/kernel"

    # --- trim what a RAM-resident test guest never needs.
    rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/{doc,man,info,locale,lintian,bash-completion} \
        "$root"/usr/lib/udev/hwdb.bin "$root"/etc/udev/hwdb.bin "$root"/var/log/*
    stage1_script >"$root/sbin/rxe-vm-init"
    chmod 755 "$root/sbin/rxe-vm-init"
    echo rxe-vm >"$root/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 rxe-vm\n' >"$root/etc/hosts"

    # --- pack. Uncompressed: unpacking is faster than decompressing.
    note "packing initramfs..."
    (cd "$root" && find . -print0 | LC_ALL=C sort -z |
        cpio --null --create --format=newc --quiet) >"$work/initrd.img"

    rm -rf "$IMG_DIR.new" && mkdir -p "$IMG_DIR.new"
    mv "$work/vmlinuz" "$work/initrd.img" "$IMG_DIR.new/"
    [[ -s $work/vmlinux ]] && mv "$work/vmlinux" "$IMG_DIR.new/"
    { echo "kernel=$kver"; echo "kernel_package=$kpkg"; echo "bootstrap=$bootstrap"; } >"$IMG_DIR.new/info"
    recipe >"$IMG_DIR.new/recipe"
    rm -rf "$IMG_DIR" && mv "$IMG_DIR.new" "$IMG_DIR"
    rm -rf --one-file-system "$work"; trap - EXIT
    note "built $IMG_DIR in $((SECONDS - t0))s (kernel $kver, initrd $(du -h "$IMG_DIR/initrd.img" | cut -f1))"
}

# -------------------------------------------------------------------- run ---
# Stage-2 init, written into the control share for every run. It runs as
# PID 1 in the guest, reads run.conf (written by the host), sets up the
# Soft-RoCE device, runs CMD and powers off.
stage2_script() {
    cat <<'EOF'
set -u
. /run/rxe-vm/run.conf
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=${TERM_HOST:-dumb}
log()  { echo "rxe-vm guest: $*" >/dev/console; }
# RXE_VM_VERBOSE=2: trace this script, with timestamps (uptime), on the console.
if [ "${VERBOSE:-0}" -ge 2 ]; then
    PS4="+ [\$(</proc/uptime)] "; exec 2>/dev/console; set -x
fi
# Report status to the host, flush, power off (sysrq "o" needs no init system).
finish() {
    echo "$1" >/run/rxe-vm/status.tmp && mv /run/rxe-vm/status.tmp /run/rxe-vm/status
    sync; umount -a -r -t 9p >/dev/null 2>&1
    echo o >/proc/sysrq-trigger; sleep 60
}
fail() { log "setup failed: $*"; dmesg | tail -n 20 >/dev/console; finish 125; }

# Basic filesystems (stage 1 mounted /proc, /sys, /dev).
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp; mount -t tmpfs -o size=64m tmpfs /run/lock 2>/dev/null
ln -sf /proc/self/fd /dev/fd && ln -sf fd/0 /dev/stdin && ln -sf fd/1 /dev/stdout && ln -sf fd/2 /dev/stderr
echo rxe-vm >/proc/sys/kernel/hostname
ip link set lo up || fail "lo up"

# Netdev under rxe0. Only VM-internal: dummy (no NIC), an isolated virtio
# NIC (host side is a dead-end hub port), or loopback.
case $NETDEV in
  dummy)  modprobe dummy numdummies=0 || fail "modprobe dummy"
          ip link add rxe-dummy0 type dummy || fail "ip link add dummy"
          dev=rxe-dummy0 ;;
  virtio) modprobe virtio_net || fail "modprobe virtio_net"
          dev=
          for ((i = 0; i < 50; i++)); do
              for n in /sys/class/net/*; do [[ ${n##*/} != lo ]] && { dev=${n##*/}; break 2; }; done
              sleep 0.1
          done
          [ -n "$dev" ] || fail "no virtio NIC" ;;
  lo)     dev=lo ;;
  *)      fail "unknown RXE_VM_NETDEV=$NETDEV" ;;
esac
if [ "$dev" != lo ]; then
    ip link set "$dev" up || fail "link up $dev"
    ip addr add "$IPCIDR" dev "$dev" || fail "ip addr add $IPCIDR dev $dev"
fi

# Soft-RoCE.
modprobe -a rdma_rxe rdma_ucm ib_umad || fail "modprobe rdma_rxe"
rdma link add rxe0 type rxe netdev "$dev" || fail "rdma link add rxe0 netdev $dev"
# (Builtins only where it is cheap: every fork+exec costs ~30 ms under TCG.)
state=/sys/class/infiniband/rxe0/ports/1/state
for ((i = 0; i < 100; i++)); do
    [[ -r $state && $(<"$state") == *ACTIVE* ]] && break; sleep 0.05
done
[[ -r $state && $(<"$state") == *ACTIVE* ]] || fail "rxe0 port not ACTIVE"
[ -c /dev/infiniband/uverbs0 ] || fail "no /dev/infiniband/uverbs0"
# GID index of our IPv4 address (RoCEv2), for tools that need -x/--gid-index.
gid_index=
ip4=${IPCIDR%/*}
[ "$dev" = lo ] && ip4=127.0.0.1
IFS=. read -r o1 o2 o3 o4 <<<"$ip4"
printf -v want "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x" "$o1" "$o2" "$o3" "$o4"
port1=/sys/class/infiniband/rxe0/ports/1
for ((i = 0; i < 40; i++)); do
    for g in "$port1"/gids/*; do
        [[ $(<"$g") == "$want" ]] 2>/dev/null || continue
        [[ $(<"$port1/gid_attrs/types/${g##*/}") == "RoCE v2" ]] 2>/dev/null || continue
        gid_index=${g##*/}; break 2
    done
    sleep 0.05
done
[ -n "$gid_index" ] || log "warning: no RoCE v2 GID for $ip4"

# Host directories, each at its host path (9p, read-write).
i=0
for d in "${SHARES[@]}"; do
    mkdir -p "$d" && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,access=client "rxe_share$i" "$d" ||
        fail "cannot mount share $d"
    i=$((i + 1))
done

# virtio-serial ports that carry CMD output to the host.
modprobe virtio_console || fail "modprobe virtio_console"
port() {
    local p n
    for p in /sys/class/virtio-ports/*; do
        read -r n <"$p/name" 2>/dev/null && [ "$n" = "$1" ] && { echo "/dev/${p##*/}"; return 0; }
    done
    return 1
}
for ((i = 0; i < 200; i++)); do
    out=$(port rxe.stdout) && err=$(port rxe.stderr) && break
    sleep 0.05
done
[ -c "${out:-}" ] && [ -c "${err:-}" ] || fail "virtio-serial ports missing"

ulimit -l unlimited; ulimit -c 0
export RXE_VM=1 RXE_DEV=rxe0 RXE_NETDEV=$dev RXE_IP=$ip4 RXE_GID_INDEX=$gid_index
cd "$WORKDIR" || fail "cd $WORKDIR"
[ "${VERBOSE:-0}" -ge 1 ] && log "rxe0 on $dev ($ip4, gid index ${gid_index:-?}) ready after ${SECONDS}s, running command"
if [ "$INTERACTIVE" = 1 ]; then
    setsid -c bash -l </dev/hvc0 >/dev/hvc0 2>&1; rc=$?
else
    bash /run/rxe-vm/cmd </dev/null >"$out" 2>"$err"; rc=$?
fi
finish $rc
EOF
}

# Run-time state shared with the EXIT trap.
RUN_TMP='' QEMU_PID=''
READER_PIDS=()
on_run_exit() {
    local rc=$?
    # Kill only what this script started (timeout(1) forwards to qemu).
    [[ -n $QEMU_PID ]] && kill "$QEMU_PID" 2>/dev/null
    for p in ${READER_PIDS[@]+"${READER_PIDS[@]}"}; do kill "$p" 2>/dev/null; done
    [[ -n $RUN_TMP ]] && rm -rf "$RUN_TMP"
    exit "$rc"
}

# KVM only helps with hardware virtualization (kvm_intel / kvm_amd). Some
# sandboxes expose a /dev/kvm backed by PVM (kvm_pvm, no VMX/SVM) that cannot
# boot a stock distribution kernel (it hangs in the bzImage decompressor, and
# with a PVH-booted vmlinux dies on "emulation failure" at cmpxchg16b), so
# "auto" picks TCG there.
pick_accel() {
    case $RXE_VM_ACCEL in
      kvm|tcg) echo "$RXE_VM_ACCEL" ;;
      auto) if [[ -r /dev/kvm && -w /dev/kvm ]] &&
               [[ -d /sys/module/kvm_intel || -d /sys/module/kvm_amd ]] &&
               [[ ! -d /sys/module/kvm_pvm ]]; then
                echo kvm
            else
                echo tcg
            fi ;;
      *) die "RXE_VM_ACCEL must be kvm, tcg or auto" ;;
    esac
}

cmd_run() {   # cmd_run INTERACTIVE CMD...
    local interactive=$1; shift
    [[ $interactive == 1 || $# -gt 0 ]] || die "usage: $PROG run CMD [ARGS...]"
    image_ok || die "no image in $IMG_DIR (run '$PROG build' first)"
    command -v qemu-system-x86_64 >/dev/null || need_host_tools qemu-system-x86_64:qemu-system-x86

    local accel; accel=$(pick_accel)
    # Prefer the uncompressed vmlinux (PVH boot); RXE_VM_KERNEL=bzimage forces
    # the classic bzImage path.
    local kernel=$IMG_DIR/vmlinux
    [[ -s $kernel && ${RXE_VM_KERNEL:-} != bzimage ]] || kernel=$IMG_DIR/vmlinuz
    local quiet="quiet loglevel=3"
    [[ $RXE_VM_VERBOSE -ge 2 ]] && quiet="loglevel=7"
    local cwd; cwd=$(pwd -P)
    local shares=("$cwd") d
    if [[ -n $RXE_VM_SHARES ]]; then
        local IFS=:
        for d in $RXE_VM_SHARES; do
            [[ -d $d ]] || die "RXE_VM_SHARES: no such directory: $d"
            d=$(cd "$d" && pwd -P); [[ $d == "$cwd" ]] || shares+=("$d")
        done
        unset IFS
    fi

    # Globals (not locals) so that the EXIT trap still sees them.
    RUN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/rxe-vm.XXXXXX")
    local T=$RUN_TMP
    trap on_run_exit EXIT
    trap 'exit 130' INT; trap 'exit 143' TERM
    mkdir "$T/ctl"
    stage2_script >"$T/ctl/init"
    { printf 'WORKDIR=%q\nNETDEV=%q\nIPCIDR=%q\nVERBOSE=%q\nINTERACTIVE=%q\nTERM_HOST=%q\n' \
          "$cwd" "$RXE_VM_NETDEV" "$RXE_VM_IP" "$RXE_VM_VERBOSE" "$interactive" "${TERM:-dumb}"
      printf 'SHARES=('; printf ' %q' "${shares[@]}"; printf ' )\n'
    } >"$T/ctl/run.conf"
    { printf 'exec'; printf ' %q' "$@"; printf '\n'; } >"$T/ctl/cmd"

    local q=(qemu-system-x86_64 -name rxe-vm -nodefaults -no-user-config
             -display none -vga none -no-reboot
             -m "$RXE_VM_MEM" -smp "$RXE_VM_CPUS"
             -kernel "$kernel" -initrd "$IMG_DIR/initrd.img"
             -append "console=ttyS0 $quiet panic=-1 rdinit=/sbin/rxe-vm-init $RXE_VM_APPEND"
             -device virtio-rng-pci
             -fsdev "local,id=ctl,path=$T/ctl,security_model=none"
             -device virtio-9p-pci,fsdev=ctl,mount_tag=rxe_ctl)
    if [[ $accel == kvm ]]; then q+=(-machine q35,accel=kvm -cpu host)
    else q+=(-machine q35 -accel tcg,thread=multi -cpu max); fi
    local i=0
    for d in "${shares[@]}"; do
        q+=(-fsdev "local,id=share$i,path=$d,security_model=none"
            -device "virtio-9p-pci,fsdev=share$i,mount_tag=rxe_share$i")
        i=$((i + 1))
    done
    if [[ $RXE_VM_NETDEV == virtio ]]; then
        # A NIC whose host side is an unconnected hub port: no traffic can
        # leave the guest; or (RXE_VM_LINK) a socket to another guest's NIC on
        # the host's loopback, nothing else on that wire. romfile= avoids
        # needing the iPXE option ROM.
        local mac=${RXE_VM_MAC:+,mac=$RXE_VM_MAC}
        case $RXE_VM_LINK in
          "")                      q+=(-netdev hubport,id=n0,hubid=0) ;;
          listen=127.0.0.1:*|connect=127.0.0.1:*) q+=(-netdev "socket,id=n0,$RXE_VM_LINK") ;;
          *) die "RXE_VM_LINK must be listen=127.0.0.1:PORT or connect=127.0.0.1:PORT" ;;
        esac
        q+=(-device "virtio-net-pci,netdev=n0,romfile=$mac")
    fi
    # CMD's stdout/stderr: virtio-serial ports -> FIFOs on the host.
    # (qemu "pipe" chardevs use NAME.in / NAME.out.)
    mkfifo "$T/stdout.in" "$T/stdout.out" "$T/stderr.in" "$T/stderr.out"
    q+=(-device virtio-serial-pci,id=vser
        -chardev "pipe,id=out,path=$T/stdout" -device virtserialport,bus=vser.0,chardev=out,name=rxe.stdout
        -chardev "pipe,id=err,path=$T/stderr" -device virtserialport,bus=vser.0,chardev=err,name=rxe.stderr)
    if [[ $interactive == 1 ]]; then
        q+=(-chardev stdio,id=con,signal=off -device virtconsole,bus=vser.0,chardev=con
            -serial "file:$T/console.log")
    else
        q+=(-serial "file:$T/console.log")
    fi

    local t0=$EPOCHREALTIME
    cat "$T/stdout.out" & READER_PIDS+=($!)
    cat "$T/stderr.out" >&2 & READER_PIDS+=($!)
    if [[ $RXE_VM_VERBOSE -ge 1 ]]; then
        : >"$T/console.log"; tail -n +1 -f "$T/console.log" >&2 & READER_PIDS+=($!)
    fi
    local qrc=0
    if [[ $interactive == 1 ]]; then
        timeout --foreground -k 5 "$RXE_VM_TIMEOUT" "${q[@]}" || qrc=$?
    else
        timeout -k 5 "$RXE_VM_TIMEOUT" "${q[@]}" </dev/null & QEMU_PID=$!
        wait "$QEMU_PID" || qrc=$?
        QEMU_PID=
    fi
    # If qemu died before opening the FIFOs, the readers still wait in
    # open(): open+close each FIFO once so they see EOF, then collect them.
    local fd
    for d in stdout stderr; do exec {fd}<>"$T/$d.out"; exec {fd}>&-; done
    wait "${READER_PIDS[0]}" "${READER_PIDS[1]}" 2>/dev/null || true
    if [[ $RXE_VM_VERBOSE -ge 1 ]]; then sleep 0.2; kill "${READER_PIDS[2]}" 2>/dev/null || true; fi
    READER_PIDS=()
    local dt; dt=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')

    local rc
    if [[ $qrc == 124 || $qrc == 137 ]]; then
        note "timeout: guest killed after ${RXE_VM_TIMEOUT}s (RXE_VM_TIMEOUT)"
        tail -n 20 "$T/console.log" >&2 2>/dev/null || true
        rc=124
    elif [[ -s $T/ctl/status ]]; then
        rc=$(cat "$T/ctl/status")
        [[ $RXE_VM_VERBOSE -ge 1 ]] && note "guest exited: status $rc, ${dt}s total, accel $accel"
        if [[ $rc == 125 && $RXE_VM_VERBOSE == 0 ]]; then
            note "guest setup failed; console:"; tail -n 40 "$T/console.log" >&2
        fi
    else
        note "guest failed (qemu exit $qrc, no status); console log:"
        tail -n 40 "$T/console.log" >&2 2>/dev/null || true
        rc=125
    fi
    return "$rc"
}

cmd_info() {
    echo "cache dir: $RXE_VM_DIR"
    if image_ok; then
        cat "$IMG_DIR/info"; du -h "$IMG_DIR"/*
    else echo "image: not built"; fi
    echo "accel: $(pick_accel)"
}

# --help: the comment block at the top of this file.
usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }

case ${1:-} in
  build) shift; cmd_build "$@" ;;
  run)   shift; rc=0; cmd_run 0 "$@" || rc=$?; exit "$rc" ;;
  shell) shift; rc=0; cmd_run 1 || rc=$?; exit "$rc" ;;
  info)  cmd_info ;;
  clean) rm -rf "$IMG_DIR" "$IMG_DIR.new"; note "removed $IMG_DIR" ;;
  -h|--help|help|"") usage ;;
  *) die "unknown command '$1' (try --help)" ;;
esac
