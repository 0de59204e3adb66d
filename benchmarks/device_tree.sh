#!/bin/bash
# The device tool sends the checkout's tracked files (plus untracked, not ignored ones, plus carried paths), at most
# 64 MiB. main's tracked tree is larger (the bundled models and the committed samples, about 74 MiB), so a device
# job that needs neither first switches the checkout to a commit without them, and switches back afterwards:
#
#   benchmarks/device_tree.sh size [CARRY...]   # what would travel now, and after `slim`, with these carried paths
#   benchmarks/device_tree.sh slim              # branch device-slim: main minus SLIM_PATHS (the files leave the disk)
#   ... device run ...
#   benchmarks/device_tree.sh restore           # back to the branch you were on; device-slim deleted
#
# Nothing is lost: the files are in main's commits, and `slim` refuses a checkout with uncommitted changes.
set -euo pipefail
SLIM_PATHS=(hub_artifacts benchmarks/results)
cd "$(git rev-parse --show-toplevel)"

tracked_bytes() {  # bytes of the tracked files, minus the paths given
  local excludes=()
  for path in "$@"; do excludes+=(":(exclude)$path"); done
  git ls-files -z -- . "${excludes[@]}" | xargs -0 -r stat -c %s | awk '{s += $1} END {print s + 0}'
}
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

case "${1:-}" in
  size)
    shift
    carry=0
    for path in "$@"; do carry=$((carry + $(du -sb "$path" | cut -f1))); done
    now=$(tracked_bytes); slim=$(tracked_bytes "${SLIM_PATHS[@]}")
    echo "tracked now: $(mib "$now"); after slim: $(mib "$slim"); carried: $(mib "$carry")"
    echo "would travel after slim: $(mib $((slim + carry))) of 64 MiB"
    [ $((slim + carry)) -le $((64 * 1048576)) ] || { echo "over the device's 64 MiB: carry less" >&2; exit 1; }
    ;;
  slim)
    if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
      echo "The checkout has uncommitted changes: commit or stash them first (slim switches branches)." >&2
      exit 1
    fi
    git rev-parse --abbrev-ref HEAD > .git/device-slim-from
    git switch -q -C device-slim
    git rm -r -q -- "${SLIM_PATHS[@]}"
    git -c user.name=device -c user.email=device@localhost commit -q -m "device: slim tree (no ${SLIM_PATHS[*]})"
    echo "on device-slim (from $(cat .git/device-slim-from)); tracked: $(mib "$(tracked_bytes)")"
    ;;
  restore)
    [ "$(git rev-parse --abbrev-ref HEAD)" = device-slim ] || { echo "not on device-slim: nothing to restore" >&2; exit 1; }
    git switch -q "$(cat .git/device-slim-from 2>/dev/null || echo main)"
    git branch -q -D device-slim
    rm -f .git/device-slim-from
    echo "back on $(git rev-parse --abbrev-ref HEAD); $(git status --porcelain | wc -l) changed paths"
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
