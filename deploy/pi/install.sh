#!/usr/bin/env bash
# Install nlagg on a Raspberry Pi (or any Debian-like Linux) as a systemd-managed sensor node.
#
#   sudo deploy/pi/install.sh --bundle node3.tar.gz --enable
#
# What it does: creates the service user, a virtual environment under the prefix, installs nlagg
# from this source tree with pip using binary wheels only (nothing is compiled on the device),
# copies the sensor scripts, installs the nlagg-node@.service template, and unpacks a node bundle
# (from `nlagg deploy bundle`) into /etc/nlagg. Needs Python >= 3.11 with venv (Raspberry Pi OS
# bookworm: sudo apt-get install python3-venv) and a 64-bit OS (aarch64): numpy, scipy, numba and
# friends publish aarch64 wheels, not 32-bit ARM ones.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source_dir="$(cd "$here/../.." && pwd)"
prefix=/opt/nlagg
etc=/etc/nlagg
systemd_dir=/etc/systemd/system
user=nlagg
bundle=""
enable=0
systemd=1
venv_args=()
python="${PYTHON:-python3}"

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    cat <<USAGE
Options:
  --bundle FILE            node bundle from 'nlagg deploy bundle' to unpack into the config dir
  --enable                 enable and start nlagg-node@<id> for the bundle's node
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
    armv7l|armv6l) die "32-bit ARM: numpy/scipy/numba have no wheels there; install a 64-bit OS" ;;
    *) say "warning: untested architecture $(uname -m); pip may not find wheels" ;;
esac

if ! id -u "$user" >/dev/null 2>&1; then
    say "creating system user $user"
    useradd --system --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin "$user"
fi

say "virtual environment in $prefix/venv"
mkdir -p "$prefix"
"$python" -m venv "${venv_args[@]}" "$prefix/venv"
pip=("$prefix/venv/bin/python" -m pip --disable-pip-version-check --no-input)
# nlagg itself is pure Python (pip builds it without compiling anything); every dependency must
# come as a binary wheel, so a missing wheel fails here instead of compiling for an hour.
"${pip[@]}" install --quiet --only-binary=:all: "$source_dir"
"$prefix/venv/bin/nlagg" --help >/dev/null || die "the installed nlagg does not start"

say "sensor scripts in $prefix/sensors"
mkdir -p "$prefix/sensors"
install -m 0755 "$here"/sensors/* "$prefix/sensors/"
install -m 0644 "$source_dir/deploy/README.md" "$prefix/README-deploy.md"

mkdir -p "$etc"
chown "root:$user" "$etc"
chmod 0750 "$etc"
node_id=""
if [ -n "$bundle" ]; then
    say "unpacking $bundle into $etc"
    tar -xzf "$bundle" -C "$etc" --no-same-owner
    chown -R "root:$user" "$etc"
    find "$etc" -type d -exec chmod 0750 {} +
    find "$etc" -type f -exec chmod g+r,o-rwx {} +
    node_files=("$etc"/nodes/*.toml)
    [ "${#node_files[@]}" = 1 ] || die "$bundle must hold exactly one nodes/<id>.toml"
    node_id="$(basename "${node_files[0]}" .toml)"
fi

if [ "$systemd" = 1 ]; then
    say "systemd unit $systemd_dir/nlagg-node@.service"
    sed -e "s#/opt/nlagg#$prefix#g" -e "s#/etc/nlagg#$etc#g" -e "s#^User=nlagg#User=$user#" \
        -e "s#^Group=nlagg#Group=$user#" "$here/nlagg-node@.service" > "$systemd_dir/nlagg-node@.service"
    chmod 0644 "$systemd_dir/nlagg-node@.service"
    systemctl daemon-reload
    if [ "$enable" = 1 ]; then
        [ -n "$node_id" ] || die "--enable needs --bundle (which node?)"
        systemctl enable --now "nlagg-node@$node_id"
        say "started nlagg-node@$node_id: journalctl -fu nlagg-node@$node_id"
    fi
fi
say "done. Check a node file with: $prefix/venv/bin/nlagg deploy node $etc/nodes/<id>.toml --dry-run"
