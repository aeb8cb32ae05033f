# Sourced by scripts that build into shared caches (scripts/pi-rootfs, scripts/base-image).
#
# safe_rm PATH...   rm -rf that refuses a tree with anything mounted at or inside it (as
#                   /proc/self/mountinfo shows: a chroot's bind of the host's /dev, /proc or /sys)
#                   and never crosses into another file system while it walks. Exit 4 on refusal.
safe_rm() {
    local target real
    for target in "$@"; do
        [ -e "$target" ] || [ -L "$target" ] || continue
        real=$(realpath -- "$target")
        if awk -v t="$real" '{ p = $5; gsub(/\\040/, " ", p) }
            p == t || index(p, t "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
            printf 'safe_rm: refusing to remove %s: something is mounted inside it (/proc/self/mountinfo)\n' \
                "$target" >&2
            exit 4
        fi
        rm -rf --one-file-system -- "$target"
    done
}

# cache_lock DIR NAME   hold an exclusive lock on DIR/NAME.lock until this script exits; a second
#                       run waits here for the first, then finds what it built.
cache_lock() {
    mkdir -p "$1"
    exec 9>"$1/$2.lock"
    flock 9
}
