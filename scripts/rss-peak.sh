#!/usr/bin/env bash
# Runs a command and reports the peak of its anonymous resident memory (RssAnon: heap, KV
# cache, scratch — what the process itself owns) and of its file-backed resident pages
# (RssFile: the mapped model, which the OS can drop and read again), sampled from
# /proc/PID/status every 20 ms (Linux). The command's own output goes where it would.
#
#   scripts/rss-peak.sh target/release/sparrow run -m model.gguf -c 512 -n 64 -p "Hi"
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
"$@" &
pid=$!
anon=0
file=0
while kill -0 "$pid" 2>/dev/null; do
    if s=$(cat "/proc/$pid/status" 2>/dev/null); then
        a=$(awk '/^RssAnon:/ {print $2}' <<<"$s")
        f=$(awk '/^RssFile:/ {print $2}' <<<"$s")
        [ -n "$a" ] && [ "$a" -gt "$anon" ] && anon=$a
        [ -n "$f" ] && [ "$f" -gt "$file" ] && file=$f
    fi
    sleep 0.02
done
rc=0
wait "$pid" || rc=$?
awk -v a="$anon" -v f="$file" 'BEGIN { printf "rss-peak: RssAnon %.1f MiB, RssFile %.1f MiB\n", a / 1024, f / 1024 }' >&2
exit "$rc"
