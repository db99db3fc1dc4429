#!/bin/bash
# A full disk must never replace a good calibration file, nor leave a temporary behind:
#   check_disk_full.sh COST_STORE_WRITER
# Mounts a 64 KiB tmpfs in a private mount namespace (unshare -m as root, else unshare -rm),
# writes a good file, fills the tmpfs, then saves a small store (under 1 KiB: std::ofstream kept it
# in its buffer, so the write error surfaced only at the unchecked close and an empty file replaced
# the good one) and a large one (that failed, but left the temporary behind). Exit 77 (ctest: skipped) when no namespace or
# tmpfs can be had here.
set -u
writer=$1
if [ "${KDIST_DISK_FULL_NS:-}" != 1 ]; then
  for flags in -m -rm; do
    if unshare "$flags" true 2>/dev/null; then
      KDIST_DISK_FULL_NS=1 exec unshare "$flags" "$0" "$@"
    fi
  done
  echo "SKIPPED: no private mount namespace here (unshare -m and unshare -rm both failed)"
  exit 77
fi
dir=$(mktemp -d /tmp/kdist_disk_full.XXXXXX)
reference=$(mktemp /tmp/kdist_disk_full_ref.XXXXXX)
cleanup() { umount "$dir" 2>/dev/null; rmdir "$dir"; rm -f "$reference"; }
trap cleanup EXIT
if ! mount -t tmpfs -o size=64k tmpfs "$dir" 2>/dev/null; then
  echo "SKIPPED: cannot mount a tmpfs in the namespace"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
good="$dir/costs.json"
"$writer" "$good" 1 || fail "could not write the good file on an empty tmpfs"
cp "$good" "$reference"
dd if=/dev/zero of="$dir/fill" bs=1024 2>/dev/null  # until ENOSPC
for store in "1 2" "200 16"; do
  # shellcheck disable=SC2086 # "entries points"
  out=$("$writer" "$good" $store 2>&1) && fail "saving a store of $store (entries points) on a full disk reported success"
  echo "store of $store (entries points): $out"
  case "$out" in *"$good"*) ;; *) fail "the error does not name $good" ;; esac
  cmp -s "$good" "$reference" || fail "the good file changed after a failed save of $store (entries points)"
  leftover=$(ls "$dir" | grep '\.tmp\.')
  [ -z "$leftover" ] || fail "temporary left behind: $leftover"
done
rm -f "$dir/fill"
"$writer" "$good" 2 || fail "saving after freeing space failed"
cmp -s "$good" "$reference" && fail "the file did not change after a successful save"
echo "PASSED: full disk leaves the good file intact and no temporary"
