#!/usr/bin/env python3
"""Count the guest instructions an aarch64 program executes under qemu-user.

qemu-user here is built without TCG plugins, so the count comes from qemu's own logs:
`-d in_asm` prints every translation block (TB) once, when it is translated, with its
instructions; `-d exec` with `nochain` prints one line per TB *executed* (chaining off, so
no TB jumps straight into the next without passing the logger). Executed instructions =
sum over executed TBs of that TB's instruction count. Exact for straight-line TBs; a TB
left early by an exception would be over-counted (none happen in the kernels).

Usage: qemu_insn_count.py BINARY [ARGS...]   -> prints the count on stdout
"""
import os
import re
import subprocess
import sys
import tempfile

INSN = re.compile(r"^0x([0-9a-f]+):\s")
TRACE = re.compile(r"^Trace \d+: 0x[0-9a-f]+ \[[0-9a-f]+/([0-9a-f]+)/")


def count(binary: str, args: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "qemu.log")
        cmd = ["qemu-aarch64", "-d", "in_asm,exec,nochain", "-D", log, binary, *args]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"qemu_insn_count: {' '.join(cmd)} failed ({r.returncode}): {r.stderr}")
        sizes: dict[int, int] = {}
        total = 0
        cur_pc, cur_n = None, 0
        with open(log, errors="replace") as f:
            for line in f:
                m = INSN.match(line)
                if m:
                    if cur_pc is None:
                        cur_pc = int(m.group(1), 16)
                    cur_n += 1
                    continue
                if cur_pc is not None:
                    # A TB listing ended: remember its size (a retranslation at the same pc
                    # replaces it).
                    sizes[cur_pc] = cur_n
                    cur_pc, cur_n = None, 0
                t = TRACE.match(line)
                if t:
                    pc = int(t.group(1), 16)
                    n = sizes.get(pc)
                    if n is None:
                        sys.exit(f"qemu_insn_count: executed TB at {pc:#x} was never listed")
                    total += n
        return total


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(count(sys.argv[1], sys.argv[2:]))
