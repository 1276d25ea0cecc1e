#!/usr/bin/env bash
# Guest instructions per weight block of the int8 matvec row kernels on aarch64, scalar
# against NEON and NEON+sdot, counted under qemu-user (see scripts/qemu_insn_count.py for
# how; docs/aarch64.md for the figures). qemu cannot time real hardware: this is a proxy
# for the work each kernel does, not a speed.
#
#   scripts/insn-count-aarch64.sh [TYPES...]     # default: Q4_K Q5_0 Q6_K Q8_0
set -euo pipefail
cd "$(dirname "$0")/.."

TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(Q4_K Q5_0 Q6_K Q8_0)
ROWS=32
COLS=4096
REPS=2

./scripts/test-aarch64.sh -- build --release -p sparrow-quant --example matvec_once >&2
BIN="${CARGO_TARGET_DIR_AARCH64:-target/aarch64}/aarch64-unknown-linux-gnu/release/examples/matvec_once"

block_elems() { case "$1" in Q4_K | Q5_K | Q6_K | Q2_K | Q3_K | Q8_K) echo 256 ;; *) echo 32 ;; esac; }

printf '| type | scalar | neon | neondot | scalar / neon | scalar / neondot |\n'
printf '|---|---:|---:|---:|---:|---:|\n'
for ty in "${TYPES[@]}"; do
    blocks=$((ROWS * COLS / $(block_elems "$ty") * REPS))
    declare -A per
    for level in scalar neon neondot; do
        base=$(python3 scripts/qemu_insn_count.py "$BIN" "$ty" "$level" "$ROWS" "$COLS" 0)
        run=$(python3 scripts/qemu_insn_count.py "$BIN" "$ty" "$level" "$ROWS" "$COLS" "$REPS")
        per[$level]=$(python3 -c "print(f'{($run - $base) / $blocks:.1f}')")
    done
    ratio() { python3 -c "print(f'{${per[scalar]} / $1:.1f}x')"; }
    printf '| %s | %s | %s | %s | %s | %s |\n' "$ty" "${per[scalar]}" "${per[neon]}" \
        "${per[neondot]}" "$(ratio "${per[neon]}")" "$(ratio "${per[neondot]}")"
    unset per
done
echo "(guest instructions per weight block: $ROWS x $COLS matrix, $REPS passes, minus a run with 0)"
