"""Offline study of the cells router's shape (docs/long-context.md, "Fewer buckets,
shorter segments"): at a given cost — keys per cell, S / C — which bucket count C and
segment S capture the most attention mass, and whether a cell's key spread helps its score.

For sampled queries of a held-out context (the records' last query positions), at the
engine's read target (5% of the context, at most MAXREAD positions, sink and 63 recent
positions included), each (C, S) splits the de-roped-key k-means buckets (trained on the
2nd..5th record of $RECS) by segments of S positions, scores every non-empty cell as the
engine does — ln count + the group's mean query · the cell's mean RoPE'd key / sqrt(d) —
and reads the top cells that fit. Variants add half the logit variance the cell's keys
give the group's mean query, from their per-dimension spread (`+diag/2`, `+diag/4`).
Quest (pages of 16, per-head min/max bounds summed over the group) and the token oracle
read the same number of positions.

    python3 scripts/analysis/saap_cell_shapes.py LAYERS C:S,C:S,...
    # e.g. 1,3,5 1024:8192,128:1024; EVAL=path.saapc evaluates on that record instead of
    # the 6th record of $RECS (default /tmp/recs); NQ queries (default 8), MAXREAD (1024,
    # 0 for none); centroids are cached in $CENTROIDS (default /tmp/saap-centroids).

Needs numpy. An analysis aid, not part of the engine or its tests.
"""
import os, sys, numpy as np
from saap_records import load, rope, kmeans, assign

RECS = os.environ.get('RECS', '/tmp/recs')
CACHE = os.environ.get('CENTROIDS', '/tmp/saap-centroids')
os.makedirs(CACHE, exist_ok=True)
train_ctx = [load(f'{RECS}/ctx-000{i}.saapc') for i in range(1, 5)]
meta, keys, qs = load(os.environ.get('EVAL', f'{RECS}/ctx-0005.saapc'))
d = meta['head_dim']; base = meta['rope']['base']; g = meta['n_head'] // meta['n_head_kv']
layers = [int(x) for x in sys.argv[1].split(',')]
shapes = [tuple(int(y) for y in x.split(':')) for x in sys.argv[2].split(',')]
NQ = int(os.environ.get('NQ', 8)); MAXREAD = int(os.environ.get('MAXREAD', 1024))
SHARE, WIN = 0.05, 63

def centroids(C, layer, kvh):
    f = f'{CACHE}/{C}_{layer}_{kvh}.npy'
    if os.path.exists(f):
        return np.load(f)
    cen = kmeans(np.concatenate([c[1][layer, 1:, kvh] for c in train_ctx]), C)
    np.save(f, cen)
    return cen

def top_that_fit(score, sizes, budget):
    """The highest-scoring non-empty cells, in rank order, until one does not fit."""
    chosen = np.zeros(len(score), bool); taken = 0
    for c in np.argsort(-score):
        if sizes[c] == 0:
            break
        if taken > 0 and taken + sizes[c] > budget:
            break
        chosen[c] = True; taken += sizes[c]
    return chosen

n = meta['n_tokens']; qpos = meta['query_positions']
qidx = np.linspace(len(qpos) - 1, max(0, len(qpos) - 61), NQ).astype(int)
res = {}
for layer in layers:
    for kvh in range(meta['n_head_kv']):
        K = keys[layer, :, kvh]
        Kr = rope(K, np.arange(n), base, d)
        bucket = {C: assign(K, centroids(C, layer, kvh)) for C in sorted({c for c, _ in shapes})}
        resid = {C: np.linalg.norm(K - centroids(C, layer, kvh)[b], axis=1) for C, b in bucket.items()}
        for qi in qidx:
            p = qpos[qi]
            Qr = rope(qs[layer, qi, kvh * g:(kvh + 1) * g], np.full(g, p), base, d)
            logits = Qr @ Kr[:p + 1].T / np.sqrt(d)
            A = np.exp(logits - logits.max(1, keepdims=True)); A /= A.sum(1, keepdims=True)
            dense = np.zeros(p + 1, bool); dense[0] = True; dense[p - WIN + 1:] = True
            cand = np.where(~dense)[0]
            target = int(np.ceil(SHARE * (p + 1)))
            if MAXREAD:
                target = min(target, MAXREAD)
            budget = target - dense.sum()
            top = np.argmax(A[:, cand], axis=1)  # each query head's strongest far key
            def captured(sel):
                return (A[:, dense].sum(1).mean() + A[:, cand[sel]].sum(1).mean(),
                        (sel.sum() + dense.sum()) / (p + 1), sel[top].mean())
            Kc = Kr[cand]; qbar = Qr.mean(0)
            for C, S in shapes:
                cell = (cand // S) * C + bucket[C][cand]
                ncell = C * ((p + S) // S)
                size = np.bincount(cell, minlength=ncell); nz = size > 0; div = np.maximum(size, 1)
                mu = np.zeros((ncell, d)); np.add.at(mu, cell, Kc); mu /= div[:, None]
                sq = np.zeros((ncell, d)); np.add.at(sq, cell, Kc ** 2)
                var = np.maximum(sq / div[:, None] - mu ** 2, 0)
                mean = np.where(nz, np.log(div) + mu @ qbar / np.sqrt(d), -np.inf)
                spread = var @ (qbar ** 2) / d
                variants = [('mean', mean), ('+diag/2', mean + 0.5 * spread)]
                for oname, far in [('outlier', resid[C][cand]), ('outlier|k|', np.linalg.norm(Kc, axis=1))]:
                    # Each cell's farthest key scored alone, the rest by their mean.
                    order = np.lexsort((-far, cell))
                    first = order[np.r_[True, cell[order][1:] != cell[order][:-1]]]
                    kout = np.zeros((ncell, d)); kout[cell[first]] = Kc[first]
                    rest = np.maximum(size - 1, 0)
                    mu_rest = (mu * div[:, None] - kout) / np.maximum(rest, 1)[:, None]
                    one = kout @ qbar / np.sqrt(d)
                    others = np.where(rest > 0, np.log(np.maximum(rest, 1)) + mu_rest @ qbar / np.sqrt(d), -np.inf)
                    variants.append((oname, np.where(nz, np.logaddexp(one, others), -np.inf)))
                for name, score in variants:
                    res.setdefault(f'C={C} S={S} {name}', []).append(captured(top_that_fit(score, size, budget)[cell]))
            page = cand // 16
            pages, inv = np.unique(page, return_inverse=True)
            lo = np.full((len(pages), d), np.inf); hi = np.full((len(pages), d), -np.inf)
            np.minimum.at(lo, inv, Kc); np.maximum.at(hi, inv, Kc)
            bound = sum(np.maximum(Qr[h] * lo, Qr[h] * hi).sum(1) for h in range(g))
            res.setdefault('quest', []).append(captured(np.isin(page, pages[np.argsort(-bound)[:budget // 16]])))
            mass = A[:, cand].sum(0); sel = np.zeros(len(cand), bool); sel[np.argsort(-mass)[:budget]] = True
            res.setdefault('token oracle', []).append(captured(sel))
    print(f'layer {layer} done', file=sys.stderr, flush=True)
for k, v in res.items():
    v = np.array(v)
    print(f'{k:28s} mass {v[:, 0].mean():.3f}  read {v[:, 1].mean() * 100:.2f}%  top key {v[:, 2].mean():.3f}')
