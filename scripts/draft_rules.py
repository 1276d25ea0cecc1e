#!/usr/bin/env python3
"""Replays stopping rules for a draft model over a trace from `examples/draft_bound.rs`.

    cargo run --release -p sparrow --example draft_bound -- TARGET DRAFT PROMPTS.json 128 2 TRACE.json
    python3 scripts/draft_rules.py TRACE.json

The trace holds, per prompt, whether the draft's greedy token was the target's at each
position of the target's greedy continuation and how sure the draft was (its best token's
probability), plus the measured seconds of a draft step and of target passes of 1..16 rows.
Each rule is simulated as sparrow's speculative decoding runs it: a round of drafting pays a
draft step per token computed; the rule says whether the token just computed is proposed
and whether to draft another; a round that proposes nothing is a plain pass; a check of k
drafts is a pass of k + 1 rows and keeps the drafts up to the first wrong one, plus the
model's own next token. Past a wrong draft the trace's probabilities (teacher-forced) stand
in for those of the draft's own branch. Prints the speed-up over plain decoding per kind.
"""
import json
import sys


def simulate(ok, p, costs, propose, carry_on, most=16):
    """Seconds to produce the continuation `ok`/`p` under the rule."""
    draft, passes = costs["draft"], costs["passes"]
    pass_of = lambda rows: passes[min(max(rows, 1), 16) - 1]
    i, seconds = 0, 0.0
    while i < len(ok):
        k, odds = 0, 1.0
        while i + k < len(ok):
            seconds += draft
            q = p[i + k]
            if not propose(q, odds):
                break
            k, odds = k + 1, odds * q
            if k >= most or not carry_on(q, odds):
                break
        if k == 0:
            seconds, i = seconds + pass_of(1), i + 1
            continue
        seconds += pass_of(k + 1)
        kept = 0
        while kept < k and ok[i + kept]:
            kept += 1
        i += kept + 1
    return seconds


def main():
    trace = json.load(open(sys.argv[1]))
    costs, prompts = trace["costs"], trace["prompts"]
    kinds = list(dict.fromkeys(pr["kind"] for pr in prompts))
    rules = [(f"per token p >= {t} (llama.cpp's)", lambda q, o, t=t: q >= t, lambda q, o: True)
             for t in (0.9, 0.75, 0.5, 0.3)]
    rules += [(f"check all, product >= {t} (sparrow's)", lambda q, o: True, lambda q, o, t=t: o >= t)
              for t in (0.9, 0.75, 0.7, 0.5, 0.3)]
    rules += [(f"check all, at most {k}", lambda q, o: True, lambda q, o: True, k) for k in (1, 2, 3)]
    print("| rule | " + " | ".join(kinds) + " |")
    print("| --- |" + " ---: |" * len(kinds))
    for name, propose, carry_on, *most in rules:
        cells = []
        for kind in kinds:
            plain = spent = 0.0
            for pr in (pr for pr in prompts if pr["kind"] == kind):
                plain += len(pr["ok"]) * costs["passes"][0]
                spent += simulate(pr["ok"], pr["p"], costs, propose, carry_on, *(most or [16]))
            cells.append(f"{plain / spent:.2f}×")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
