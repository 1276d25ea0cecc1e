#!/usr/bin/env python3
"""How many tokens a check of prompt-lookup drafts yields, replayed offline.

For each prompt of a speculative prompt set (`bench/speculative-prompts.json` format), the
model's greedy output is generated once (`sparrow run --chat --temp 0`), then the lookup is
replayed at fixed draft lengths: at each check the drafts are what `sparrow::speculative::
lookup` proposes from the prompt and the output so far, kept up to the first that differs
from the greedy output. Prints tokens per check (the quantity the speed-up multiplies) for
the lookup as it is in the code (`--rule context`: the occurrence whose preceding tokens
match longest) and the earlier rule (`latest`: the latest occurrence), so a change to the
lookup can be judged without timing noise.

    scripts/lookup_acceptance.py MODEL.gguf PROMPTS.json [--kind edit] [--sparrow PATH]
"""
import argparse
import json
import subprocess

CONTEXT_MAX = 32  # as sparrow::speculative::CONTEXT_MAX


def lookup(seq, ngram_max, want, rule):
    n_seq = len(seq)
    for n in range(min(ngram_max, n_seq - 1), 0, -1):
        tail = seq[n_seq - n:]
        best = None
        for s in range(n_seq - n - 1, -1, -1):
            if seq[s:s + n] != tail:
                continue
            if rule == "latest":
                best = (0, s)
                break
            c = 0
            while c < min(CONTEXT_MAX, s) and seq[s - 1 - c] == seq[n_seq - n - 1 - c]:
                c += 1
            if best is None or c > best[0]:
                best = (c, s)
        if best is not None:
            start = best[1] + n
            return seq[start:start + want]
    return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("--kind", default="edit")
    ap.add_argument("--sparrow", default="target/release/sparrow")
    ap.add_argument("--ngram", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    args = ap.parse_args()

    def sparrow(*a):
        return subprocess.run([args.sparrow, *a], capture_output=True, text=True, check=True).stdout

    marker = "<|im_start|>assistant\n"
    seqs = []
    for p in json.load(open(args.prompts)):
        if p["kind"] != args.kind:
            continue
        text = sparrow("run", "-m", args.model, "--chat", "--temp", "0", "-n", str(args.n), "-p", p["prompt"])
        cut = text.index(marker) + len(marker)
        ids = [json.loads(sparrow("tokenize", "-m", args.model, "-p", part)) for part in (text[:cut], text[cut:])]
        seqs.append(ids)
    for rule in ("latest", "context"):
        for k in (3, 4, 6, 8, 12):
            tokens = checks = drafted = kept = 0
            for prompt, out in seqs:
                i = 0
                while i < len(out):
                    drafts = lookup(prompt + out[:i + 1], args.ngram, k, rule)
                    a = 0
                    while a < len(drafts) and i + 1 + a < len(out) and drafts[a] == out[i + 1 + a]:
                        a += 1
                    drafted += len(drafts)
                    kept += a
                    checks += 1
                    tokens += a + 1
                    i += a + 1
            print(f"{rule:8} drafts {k:2}: {tokens / checks:.2f} tokens per check, kept {kept} of {drafted}")


if __name__ == "__main__":
    main()
