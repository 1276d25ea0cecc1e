#!/usr/bin/env bash
# Cross-compiles sparrow for aarch64-unknown-linux-gnu and runs the tests that exercise the
# NEON kernels (and one real-model greedy test) under qemu-user.
#
#   scripts/test-aarch64.sh                # install the toolchain if missing, run the tests
#   scripts/test-aarch64.sh --install-only # only install the toolchain
#   scripts/test-aarch64.sh -- ARGS...     # run `cargo ARGS...` in the aarch64 environment
#                                          # (e.g. `-- test -p sparrow-quant --test simd`)
#
# The toolchain comes from Debian's packages (no rustup target download is needed): Debian's
# rustc (`rustc-web`, /usr/bin/rustc) with the aarch64 standard library, the cross linker,
# and qemu-user from bookworm-backports. Installing needs root and apt (Debian bookworm).
# Binaries are linked statically: dynamically linked ones hang under qemu-user as soon as a
# thread starts. Builds go to target/aarch64 so the host build is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
RUSTC_DEB=/usr/bin/rustc

have_toolchain() {
    [ -x "$RUSTC_DEB" ] || return 1
    command -v aarch64-linux-gnu-gcc >/dev/null || return 1
    command -v qemu-aarch64 >/dev/null || return 1
    [ -d "$("$RUSTC_DEB" --print sysroot)/lib/rustlib/$TARGET/lib" ] || return 1
}

install_toolchain() {
    if have_toolchain; then
        return 0
    fi
    echo "test-aarch64: installing the cross toolchain (Debian packages)" >&2
    if [ "$(id -u)" != 0 ]; then
        echo "test-aarch64: installing needs root (apt-get); run as root once" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    dpkg --add-architecture arm64
    local list=/etc/apt/sources.list.d/bookworm-backports.list
    if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        echo "deb http://deb.debian.org/debian bookworm-backports main" >"$list"
    fi
    apt-get update -qq
    apt-get install -y -qq rustc-web "libstd-rust-web-dev:arm64" gcc-aarch64-linux-gnu \
        libc6-dev-arm64-cross >/dev/null
    apt-get install -y -qq -t bookworm-backports qemu-user >/dev/null
    have_toolchain || {
        echo "test-aarch64: toolchain still incomplete after installing" >&2
        exit 1
    }
}

# cargo in the aarch64 environment.
xcargo() {
    RUSTC="$RUSTC_DEB" \
        CARGO_TARGET_DIR="${CARGO_TARGET_DIR_AARCH64:-target/aarch64}" \
        CARGO_BUILD_TARGET="$TARGET" \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64 \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
        cargo "$@"
}

install_toolchain
if [ "${1:-}" = "--install-only" ]; then
    exit 0
fi
if [ "${1:-}" = "--" ]; then
    shift
    xcargo "$@"
    exit $?
fi

# The NEON kernels against the scalar reference (every format, every path, both levels:
# the tests force each supported level), the NEON attention tile kernels, then one
# real-model greedy test (SmolLM2, Q4_1, teacher-forced against llama.cpp's tokens, one of
# the host test's three cache/batch configurations) through the whole engine at the best
# level.
python3 scripts/fetch_models.py smollm >/dev/null
start=$(date +%s)
xcargo test -p sparrow-quant --test simd --test dot
xcargo test -p sparrow-attn --features fp16 --lib -- kernel::tile:: \
    kernel::tests::batches_match_f64_reference_at_every_level
xcargo test -p sparrow --test greedy_families -- --ignored --exact \
    smollm2_greedy_f16_batch_matches_llama_cpp
echo "test-aarch64: passed in $(( $(date +%s) - start )) s" >&2
