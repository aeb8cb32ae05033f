#!/usr/bin/env bash
# Install nlagg on a Raspberry Pi (or any Debian-like Linux) as a systemd-managed sensor node.
#
#   sudo deploy/pi/install.sh --bundle node3.tar.gz --enable
#
# What it does: creates the service user, a virtual environment under the prefix, installs the lean
# node (nlagg without the [lab] extra: no simulator, plots, dashboard or embedded broker) from this
# source tree with pip using binary wheels only (nothing is compiled on the device),
# copies the sensor scripts, installs the nlagg-node@.service template, and unpacks a node bundle
# (from `nlagg deploy bundle`) into /etc/nlagg. Needs Python >= 3.11 with venv (Raspberry Pi OS
# bookworm: sudo apt-get install python3-venv) and a 64-bit OS (aarch64): numpy, cryptography and
# friends publish aarch64 wheels, not 32-bit ARM ones. Running it again is a no-op unless something
# changed (the source tree, a sensor script, the unit, the bundle); without a running systemd (a
# chroot, a container, an image build) the unit is installed and enabled but not started.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source_dir="$(cd "$here/../.." && pwd)"
prefix=/opt/nlagg
etc=/etc/nlagg
systemd_dir=/etc/systemd/system
user=nlagg
bundle=""
wheelhouse=""
enable=0
systemd=1
venv_args=()
python="${PYTHON:-python3}"

usage() {
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    cat <<USAGE
Options:
  --bundle FILE            node bundle from 'nlagg deploy bundle' to unpack into the config dir
  --enable                 enable and start nlagg-node@<id> for the bundle's node (again: restarted
                           only if the bundle changed)
  --wheelhouse DIR         install offline from this folder of wheels (pip --no-index --find-links),
                           e.g. one made elsewhere with pip download --platform manylinux2014_aarch64
  --source DIR             nlagg source tree to install (default: $source_dir)
  --prefix DIR             install prefix (default: $prefix)
  --etc DIR                configuration directory (default: $etc)
  --systemd-dir DIR        where the unit goes (default: $systemd_dir)
  --user NAME              service user, created if missing (default: $user)
  --no-systemd             do not install the unit nor call systemctl
  --system-site-packages   let the venv see the system's Python packages (offline installs)
USAGE
}

while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) bundle="$2"; shift 2 ;;
        --enable) enable=1; shift ;;
        --wheelhouse) wheelhouse="$(cd "$2" && pwd)"; shift 2 ;;
        --source) source_dir="$2"; shift 2 ;;
        --prefix) prefix="$2"; shift 2 ;;
        --etc) etc="$2"; shift 2 ;;
        --systemd-dir) systemd_dir="$2"; shift 2 ;;
        --user) user="$2"; shift 2 ;;
        --no-systemd) systemd=0; shift ;;
        --system-site-packages) venv_args+=(--system-site-packages); shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

say() { printf 'install.sh: %s\n' "$*"; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (sudo): it creates $prefix, $etc and a system user"
[ -f "$source_dir/pyproject.toml" ] || die "--source $source_dir holds no pyproject.toml"
[ -z "$bundle" ] || [ -f "$bundle" ] || die "--bundle $bundle: no such file"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$python is older than 3.11 (Raspberry Pi OS bookworm or newer ships 3.11)"
"$python" -c 'import venv, ensurepip' 2>/dev/null \
    || die "$python has no venv/ensurepip: apt-get install python3-venv"
case "$(uname -m)" in
    aarch64|x86_64) ;;
    armv7l|armv6l) die "32-bit ARM: numpy/cryptography have no wheels there; install a 64-bit OS" ;;
    *) say "warning: untested architecture $(uname -m); pip may not find wheels" ;;
esac

if ! id -u "$user" >/dev/null 2>&1; then
    say "creating system user $user"
    useradd --system --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin "$user"
fi

# put MODE SRC DEST: install a file only when it differs, so a second run changes nothing.
wrote=0
put() {
    if ! cmp -s "$2" "$3"; then
        install -m "$1" "$2" "$3"
        say "installed $3"
        wrote=$((wrote + 1))
    fi
    chmod "$1" "$3"
}

# What the venv was built from: the package sources (relative paths and contents), the Python
# version and the wheelhouse's file names. Unchanged -> pip is not run again.
stamp="$(
    cd "$source_dir"
    { "$python" --version; find pyproject.toml nlagg_node adversary -type f ! -name '*.pyc' -print0 \
        | sort -z | xargs -0 sha256sum; [ -z "$wheelhouse" ] || ls "$wheelhouse"; } | sha256sum | cut -c1-32
)"
venv="$prefix/venv"
mkdir -p "$prefix"
if [ -x "$venv/bin/nlagg" ] && [ "$(cat "$prefix/.installed" 2>/dev/null)" = "$stamp" ]; then
    say "virtual environment in $venv: up to date"
else
    if [ ! -x "$venv/bin/python" ]; then
        say "virtual environment in $venv"
        "$python" -m venv ${venv_args[@]+"${venv_args[@]}"} "$venv"
    fi
    pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
    if [ -n "$wheelhouse" ]; then
        pip_from=(--no-index --find-links "$wheelhouse")
    else
        pip_from=()
    fi
    # nlagg itself is pure Python (pip builds it without compiling anything); every dependency must
    # come as a binary wheel, so a missing wheel fails here instead of compiling for an hour. No
    # extra: a node needs none of the lab's packages (nlagg_node/extras.py).
    say "installing nlagg from $source_dir${wheelhouse:+ (wheels from $wheelhouse)}"
    "${pip[@]}" install --quiet --only-binary=:all: ${pip_from[@]+"${pip_from[@]}"} "$source_dir"
    "$venv/bin/nlagg" --help >/dev/null || die "the installed nlagg does not start"
    echo "$stamp" > "$prefix/.installed"
fi

mkdir -p "$prefix/sensors"
for sensor in "$here"/sensors/*; do
    put 0755 "$sensor" "$prefix/sensors/$(basename "$sensor")"
done
put 0644 "$source_dir/deploy/README.md" "$prefix/README-deploy.md"

mkdir -p "$etc"
chown "root:$user" "$etc"
chmod 0750 "$etc"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
node_id=""
bundle_changed=0
if [ -n "$bundle" ]; then
    say "node bundle $bundle into $etc"
    mkdir "$work/bundle"
    tar -xzf "$bundle" -C "$work/bundle" --no-same-owner
    node_files=("$work"/bundle/nodes/*.toml)
    [ "${#node_files[@]}" = 1 ] && [ -f "${node_files[0]}" ] \
        || die "$bundle must hold exactly one nodes/<id>.toml"
    node_id="$(basename "${node_files[0]}" .toml)"
    # Readable by the service's group, nothing for others (the node file and password are private).
    before=$wrote
    while read -r rel; do
        mkdir -p "$(dirname "$etc/$rel")"
        put 0640 "$work/bundle/$rel" "$etc/$rel"
    done < <(cd "$work/bundle" && find . -type f)
    bundle_changed=$((wrote - before))
    chown -R "root:$user" "$etc"
    find "$etc" -type d -exec chmod 0750 {} +
fi

if [ "$systemd" = 1 ]; then
    unit="$systemd_dir/nlagg-node@.service"
    mkdir -p "$systemd_dir"
    tmp_unit="$work/nlagg-node@.service"
    sed -e "s#/opt/nlagg#$prefix#g" -e "s#/etc/nlagg#$etc#g" -e "s#^User=nlagg#User=$user#" \
        -e "s#^Group=nlagg#Group=$user#" "$here/nlagg-node@.service" > "$tmp_unit"
    changed=0
    cmp -s "$tmp_unit" "$unit" || changed=1
    put 0644 "$tmp_unit" "$unit"
    # A node of a continuous deployment (its node file has 'every', docs/continuous.md) runs epoch
    # after epoch: systemd restarts it whatever its exit, and it rejoins at the next epoch's start.
    if [ -n "$node_id" ] && grep -q '^every = ' "$etc/nodes/$node_id.toml"; then
        dropin="$systemd_dir/nlagg-node@$node_id.service.d/continuous.conf"
        mkdir -p "$(dirname "$dropin")"
        printf '[Service]\nRestart=always\nRestartSec=10s\n' > "$work/continuous.conf"
        cmp -s "$work/continuous.conf" "$dropin" || changed=1
        put 0644 "$work/continuous.conf" "$dropin"
    fi
    # systemd runs the machine (a booted Pi) or not (a chroot, a container, an image being built):
    # then only the files and the enablement symlink are written, and the node starts at boot.
    running=0
    [ -d /run/systemd/system ] && running=1
    if [ "$running" = 1 ] && [ "$changed" = 1 ]; then
        systemctl daemon-reload
    fi
    if [ "$enable" = 1 ]; then
        [ -n "$node_id" ] || die "--enable needs --bundle (which node?)"
        if systemctl is-enabled --quiet "nlagg-node@$node_id" 2>/dev/null; then
            if [ "$running" = 1 ] && [ "$bundle_changed" -gt 0 ]; then
                systemctl restart "nlagg-node@$node_id"  # a new bundle: a new run
                say "restarted nlagg-node@$node_id with the new bundle"
            else
                # Not started again: a node that finished its run stays down until you start it.
                say "nlagg-node@$node_id already enabled"
            fi
        elif [ "$running" = 1 ]; then
            systemctl enable --now --quiet "nlagg-node@$node_id"
            say "started nlagg-node@$node_id: journalctl -fu nlagg-node@$node_id"
        else
            systemctl enable --quiet "nlagg-node@$node_id"
            say "enabled nlagg-node@$node_id; systemd is not running here, so it starts at the next boot"
        fi
    fi
fi
say "done. Check a node file with: $prefix/venv/bin/nlagg deploy node $etc/nodes/<id>.toml --dry-run"
