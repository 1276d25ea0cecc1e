#!/usr/bin/env bash
# Side-by-side decode/prefill benchmark: llama.cpp's llama-bench and `sparrow bench`,
# alternating round by round (the build host is shared and noisy: compare means over
# rounds, not single runs). See docs/performance.md.
#
#   LLAMA_BENCH=/path/to/llama-bench scripts/bench_vs_llama.sh [model.gguf]
set -euo pipefail
cd "$(dirname "$0")/.."
M=${1:-$HOME/.cache/sparrow/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
LB=${LLAMA_BENCH:?set LLAMA_BENCH to the path of llama-bench, built outside this repository}
S=${SPARROW:-target/release/sparrow}
[ -x "$S" ] || cargo build --release -p sparrow-cli
rate() { grep -E "$1" | tail -1 | awk -F'|' '{print $(NF-1)}'; }
echo "== tg128 (4 rounds)"
for _ in 1 2 3 4; do
  echo "llama.cpp $("$LB" -m "$M" -p 0 -n 128 -t 2 -r 3 -fa 1 2>&1 | rate tg128)"
  echo "sparrow   $("$S" bench -m "$M" -p 0 -n 128 -t 2 -r 3 2>&1 | rate tg128)"
done
echo "== pp512 (3 rounds)"
for _ in 1 2 3; do
  echo "llama.cpp $("$LB" -m "$M" -p 512 -n 0 -t 2 -r 3 -fa 1 2>&1 | rate pp512)"
  echo "sparrow   $("$S" bench -m "$M" -p 512 -n 0 -t 2 -r 3 2>&1 | rate pp512)"
done
for d in 4096 16384; do
  echo "== tg32 @ depth $d"
  echo "llama.cpp $("$LB" -m "$M" -p 0 -n 32 -d $d -t 2 -r 1 -fa 1 2>&1 | rate tg32)"
  echo "sparrow   $("$S" bench -m "$M" -p 0 -n 32 -d $d -t 2 -r 1 2>&1 | rate tg32)"
done
echo "== peak RSS of a tg128 run (KiB)"
/usr/bin/time -f %M -o /tmp/rss_llama.txt "$LB" -m "$M" -p 0 -n 128 -t 2 -r 1 -fa 1 >/dev/null 2>&1
/usr/bin/time -f %M -o /tmp/rss_sparrow.txt "$S" bench -m "$M" -p 0 -n 128 -t 2 -r 1 >/dev/null 2>&1
echo "llama.cpp $(cat /tmp/rss_llama.txt)"
echo "sparrow   $(cat /tmp/rss_sparrow.txt)"
