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

With siblings (`sparrow::speculative::SIBLING_BELOW`): each draft less sure than the bound
also has its runner-up checked, a row more in the check; when the first wrong draft's
runner-up is the model's token (the trace's `ok2`), the check gives that token and the one
after it, and the next check feeds one row more (the sibling, whose keys are not kept).
"""
import json
import sys


def simulate(ok, p, costs, propose, carry_on, most=16, sibling_below=0.0, ok2=None):
    """Seconds to produce the continuation `ok`/`p` under the rule."""
    draft, passes = costs["draft"], costs["passes"]
    pass_of = lambda rows: passes[min(max(rows, 1), 16) - 1]
    i, seconds, lead = 0, 0.0, 0
    while i < len(ok):
        k, odds, siblings = 0, 1.0, []
        while i + k < len(ok):
            seconds += draft
            q = p[i + k]
            if not propose(q, odds):
                break
            if q < sibling_below:
                siblings.append(k)
            k, odds = k + 1, odds * q
            if k >= most or not carry_on(q, odds):
                break
        if k == 0:
            seconds, i, lead = seconds + pass_of(1 + lead), i + 1, 0
            continue
        seconds += pass_of(k + 1 + len(siblings) + lead)
        kept = 0
        while kept < k and ok[i + kept]:
            kept += 1
        lead = int(kept < k and kept in siblings and ok2[i + kept])
        i += kept + 1 + lead
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
    with_siblings = "ok2" in prompts[0]
    if with_siblings:
        rules += [(f"product >= 0.75, siblings below {b}", lambda q, o: True,
                   lambda q, o: o >= 0.75, 16, b) for b in (0.5, 0.6, 0.7, 0.8, 1.01)]
    print("| rule | " + " | ".join(kinds) + " |")
    print("| --- |" + " ---: |" * len(kinds))
    for name, propose, carry_on, *rest in rules:
        most, below = (rest + [16, 0.0])[:2] if rest else (16, 0.0)
        cells = []
        for kind in kinds:
            plain = spent = 0.0
            for pr in (pr for pr in prompts if pr["kind"] == kind):
                plain += len(pr["ok"]) * costs["passes"][0]
                spent += simulate(pr["ok"], pr["p"], costs, propose, carry_on, most, below,
                                  pr.get("ok2"))
            cells.append(f"{plain / spent:.2f}×")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
