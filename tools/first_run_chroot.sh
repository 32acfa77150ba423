#!/usr/bin/env bash
# Measures the fast first run (issue 15) as a new user on a clean Debian 12 would see it, without
# touching this machine's packages: a minbase Debian 12 chroot (debootstrap), a fresh clone of HEAD
# in it, then inside: package sizes (the core group against every group), the core group's download
# from an empty apt cache (timed), and ./scripts/demo, which installs those .debs, configures, builds
# and trains (its last line gives packages / configure / build / training times). Prints the load
# average before and after: on a shared machine the build time follows it.
#
#   sudo tools/first_run_chroot.sh [CHROOT_DIR]     (default /tmp/flux-first-run; removed at the end)
# Needs root, network, debootstrap (apt-get install debootstrap) and ~1.5 GB in CHROOT_DIR. Takes
# ~2 min (debootstrap) + the demo's time. FLUX_KEEP_CHROOT=1 keeps the chroot for another look.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-/tmp/flux-first-run}
[ "$(id -u)" -eq 0 ] || { echo "[first-run] needs root (debootstrap, chroot)"; exit 2; }
command -v debootstrap >/dev/null || { echo "[first-run] needs debootstrap: apt-get install debootstrap"; exit 2; }
[ -e "$ROOT" ] && { echo "[first-run] $ROOT exists; remove it or pass another folder"; exit 2; }

cleanup() {
  mountpoint -q "$ROOT/proc" && umount "$ROOT/proc"
  [ "${FLUX_KEEP_CHROOT:-0}" = 1 ] || rm -rf "$ROOT"
}
trap cleanup EXIT

t0=$SECONDS
debootstrap --variant=minbase bookworm "$ROOT" http://deb.debian.org/debian > "$ROOT.debootstrap.log" 2>&1 ||
  { tail -20 "$ROOT.debootstrap.log"; echo "[first-run] debootstrap failed"; exit 1; }
echo "[first-run] debootstrap: $((SECONDS - t0)) s (not part of the measurement: a Debian 12 image)"
git clone -q "$PWD" "$ROOT/root/flux"
git log --oneline -1 | cut -c1-72 > "$ROOT/root/commit.txt"  # git is not in the chroot (nor in core)
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
mount -t proc proc "$ROOT/proc"

cat > "$ROOT/root/measure.sh" <<'EOF'
set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C HOME=/root
cd /root/flux
now() { date +%s.%N; }
since() { awk "BEGIN { printf \"%.1f\", $(now) - $1 }"; }
echo "[first-run] commit $(cat /root/commit.txt)"
echo "[first-run] load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
t=$(now); apt-get clean; apt-get update -qq; echo "[first-run] apt-get update: $(since $t) s"
sizes() { apt-get install --assume-no --no-install-recommends "$@" 2>&1 | grep -E 'newly installed|Need to get|After this' | sed 's/^/    /' || true; }
echo "[first-run] the core group (./scripts/demo on a machine without a GPU):"; sizes $(bash scripts/deps.sh --list core | sed 's/^core *//')
echo "[first-run] every group (scripts/deps.sh all):"; sizes $(bash scripts/deps.sh --list all | sed 's/^all *//')
t=$(now)
apt-get install -y -qq --no-install-recommends --download-only $(bash scripts/deps.sh --list core | sed 's/^core *//') >/dev/null
echo "[first-run] download of the core group: $(since $t) s, $(du -sh /var/cache/apt/archives | cut -f1)"
echo "[first-run] ./scripts/demo (installs the downloaded core group, configures, builds, trains):"
t=$(now)
./scripts/demo 2>&1 | grep -v '^\[[0-9]*/[0-9]*\] Building'
echo "[first-run] ./scripts/demo wall: $(since $t) s; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
EOF
chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb /bin/bash /root/measure.sh
