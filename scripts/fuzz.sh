#!/usr/bin/env bash
# Fuzz every parser sparrow exposes to untrusted bytes (fuzz/README.md).
#
#   scripts/fuzz.sh smoke [SECONDS]   each target for SECONDS (default 15) on the saved
#                                     corpus; what CI runs
#   scripts/fuzz.sh long [RUNS]       each target for RUNS executions (default 1,000,000),
#                                     new inputs kept in fuzz/corpus-new/<target>
#
# Needs a nightly toolchain (`cargo +nightly`) and cargo-fuzz, installed from crates.io
# when missing. The tokenizer and JSON targets use the Qwen2.5 model's tokenizer when
# scripts/fetch_models.py has fetched it (SPARROW_FUZZ_MODEL names another GGUF).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
mode=${1:-smoke}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=(gguf_parse tokenizer prompt_cache json_grammar openai_request saap_index saap_record json_schema tool_calls prefix_block)
cargo +nightly fuzz build -a
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
  case "$mode" in
    smoke)
      secs=${2:-15}
      # New inputs go to a scratch folder: the saved corpus stays as committed.
      scratch=$(mktemp -d)
      if ! cargo +nightly fuzz run -a "$t" "$scratch" "corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=3072 -print_final_stats=1 >"$log" 2>&1; then
        tail -60 "$log" >&2
        echo "fuzz target $t failed: the input is in fuzz/artifacts/$t" >&2
        exit 1
      fi
      rm -rf "$scratch"
      echo "$t: $(grep -E '^Done' "$log")"
      ;;
    long)
      mkdir -p "corpus-new/$t"
      cargo +nightly fuzz run -a "$t" "corpus-new/$t" "corpus/$t" -- \
        -runs="${2:-1000000}" -rss_limit_mb=3072 -print_final_stats=1
      ;;
    *)
      echo "usage: scripts/fuzz.sh smoke [SECONDS] | long [RUNS]" >&2
      exit 2
      ;;
  esac
done
