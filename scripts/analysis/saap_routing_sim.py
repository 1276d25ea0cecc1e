"""Offline routing study for Saap (docs/long-context.md, "Positional cells").

Reads `sparrow saap collect` records (.saapc, format in crates/sparrow/src/saap/record.rs),
runs k-means on the de-roped keys of the training contexts, and for sampled queries of a
held-out context compares, at a 5% key budget (sink + 63 recent positions always read),
the attention mass captured by: the bucket oracle, the centroid router, live bucket means
of RoPE'd keys, positional cells (bucket x segment) ranked by count and mean logit,
Quest's pages (16 positions, min/max bounds) and the token oracle.

    python3 scripts/analysis/saap_routing_sim.py C LAYERS SEGMENTS
    # e.g. 1024 1,3,5 4096,2048; EVAL=path.saapc evaluates on that record instead of the
    # 6th record of $RECS (default /tmp/recs, six 8K contexts; k-means then on the 2nd..5th);
    # NQ, STEP, CHUNKS tune the sampling.

Needs numpy. An analysis aid, not part of the engine or its tests.
"""
import os, sys, numpy as np
from saap_records import load, rope, kmeans, assign
EVAL = os.environ.get('EVAL')
RECS = os.environ.get('RECS', '/tmp/recs')
ctxs = [load(f'{RECS}/ctx-000{i}.saapc') for i in range(6)]
if EVAL:
    ctxs = ctxs[1:5] + [load(EVAL)]
meta = ctxs[0][0]; d = meta['head_dim']; base = meta['rope']['base']; g = meta['n_head']//meta['n_head_kv']
C = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
layers = [int(x) for x in sys.argv[2].split(',')] if len(sys.argv) > 2 else [4, 10, 13, 16, 20]
BUDGET = 0.05; NQ = int(os.environ.get('NQ', 13)); STEP = int(os.environ.get('STEP', 3)); CHUNKS = [int(x) for x in os.environ.get('CHUNKS', '16,8').split(',')]; WIN = 63; SEGS = [int(x) for x in sys.argv[3].split(',')] if len(sys.argv) > 3 else [1024, 256]
res = {}
for layer in layers:
  for kvh in range(meta['n_head_kv']):
    train = np.concatenate([c[1][layer, 1:, kvh] for c in ctxs[:-1]])
    cen = kmeans(train, C)
    m5, keys, qs = ctxs[-1]
    n = m5['n_tokens']; qpos = m5['query_positions']
    K = keys[layer, :, kvh]; bk = assign(K, cen)
    Kr = rope(K, np.arange(n), base, d)
    for qi in range(len(qpos)-1, len(qpos)-NQ*STEP, -STEP):
        p = qpos[qi]
        Q = qs[layer, qi, kvh*g:(kvh+1)*g]           # de-roped (g, d)
        Qr = rope(Q, np.full(g, p), base, d)
        logits = Qr @ Kr[:p+1].T / np.sqrt(d)          # (g, p+1)
        logits -= logits.max(1, keepdims=True)
        A = np.exp(logits); A /= A.sum(1, keepdims=True)
        dense = np.zeros(p+1, bool); dense[0] = True; dense[p-WIN+1:] = True
        cand = np.where(~dense)[0]
        budget = int(np.ceil(BUDGET*(p+1)))
        dmass = A[:, dense].sum(1)
        def captured(sel):  # sel: bool over cand positions
            return (dmass + A[:, cand[sel]].sum(1)).mean(), sel.sum()/(p+1)
        b = bk[cand]
        cnt = np.bincount(b, minlength=C)
        def by_buckets(score):  # score (C,), fill budget in rank order, stop at first misfit
            order = np.argsort(-score); taken = 0; chosen = np.zeros(C, bool); first=True
            for c in order:
                if cnt[c] == 0: continue
                if taken + cnt[c] > budget and not first: break
                chosen[c] = True; taken += cnt[c]; first=False
            return captured(chosen[b])
        def smx(x):
            x = x - x.max(-1, keepdims=True); e = np.exp(x); return e/e.sum(-1, keepdims=True)
        out = {}
        # bucket oracle
        om = np.zeros(C); np.add.at(om, b, A[:, cand].sum(0)); out['bucket oracle'] = by_buckets(om)
        # centroid router (de-roped)
        out['centroids'] = by_buckets(smx(Q @ cen.T / np.sqrt(d)).sum(0))
        # live moments of roped keys
        Kc = Kr[cand]
        mu = np.zeros((C, d)); np.add.at(mu, b, Kc); nzc = np.maximum(cnt, 1)
        mu /= nzc[:, None]
        sq = np.zeros((C, d)); np.add.at(sq, b, Kc**2); var = np.maximum(sq/nzc[:, None] - mu**2, 0)
        logn = np.where(cnt > 0, np.log(nzc), -1e30)
        out['live mean'] = by_buckets(smx(logn + Qr @ mu.T / np.sqrt(d)).sum(0))
        out['live mean+var'] = by_buckets(smx(logn + Qr @ mu.T / np.sqrt(d) + 0.5*(Qr**2) @ var.T / d).sum(0))
        out['live mean+var/4'] = by_buckets(smx(logn + Qr @ mu.T / np.sqrt(d) + 0.125*(Qr**2) @ var.T / d).sum(0))
        Kd = K[cand]; mud = np.zeros((C, d)); np.add.at(mud, b, Kd); mud /= nzc[:, None]
        out['live mean deroped'] = by_buckets(smx(logn + Q @ mud.T / np.sqrt(d)).sum(0))
        for R in CHUNKS:
            # chunks of R consecutive entries of each bucket's list (positions ascending)
            order_pos = np.lexsort((cand, b))          # by bucket, then position
            rank = np.empty(len(cand), int)
            starts = np.concatenate([[0], np.cumsum(cnt)[:-1]])
            rank[order_pos] = np.arange(len(cand)) - np.repeat(starts, cnt)
            maxch = (cnt.max() + R - 1) // R
            cell = b * maxch + rank // R
            ncell = C * maxch
            ccnt = np.bincount(cell, minlength=ncell); cz = np.maximum(ccnt, 1)
            cmu = np.zeros((ncell, d)); np.add.at(cmu, cell, Kc); cmu /= cz[:, None]
            lm = smx(logn + Qr @ mu.T / np.sqrt(d)).sum(0)
            for lvl1, score1 in [('live', lm), ('cen', smx(Q @ cen.T / np.sqrt(d)).sum(0))]:
                order = np.argsort(-score1); taken = 0; top = []
                for c in order:
                    if cnt[c] == 0: continue
                    if taken > 2 * budget: break
                    top.append(c); taken += cnt[c]
                top = np.array(top)
                cc = (top[:, None] * maxch + np.arange(maxch)[None, :]).ravel()
                cc = cc[ccnt[cc] > 0]
                sc2 = smx(np.log(ccnt[cc]) + Qr @ cmu[cc].T / np.sqrt(d)).sum(0)
                order = cc[np.argsort(-sc2)]; taken = 0; chosen = np.zeros(ncell, bool)
                for c in order:
                    if taken + ccnt[c] > budget and taken > 0: break
                    chosen[c] = True; taken += ccnt[c]
                out[f'{lvl1}+chunks R={R}'] = captured(chosen[cell])
                res.setdefault(f'chunks scored {lvl1} R={R}', []).append((len(cc), 0))
        for S in SEGS:
            cell = b * ((p + S) // S) + cand // S
            ncell = C * ((p + S) // S)
            ccnt = np.bincount(cell, minlength=ncell); cz = np.maximum(ccnt, 1)
            cmu = np.zeros((ncell, d)); np.add.at(cmu, cell, Kc); cmu /= cz[:, None]
            nzcell = np.where(ccnt > 0)[0]
            cs = np.full(ncell, -1e30)
            # group-summed query: one product per cell, as Quest sums its bounds over the group
            cs[nzcell] = np.log(ccnt[nzcell]) + (Qr.sum(0) @ cmu[nzcell].T) / np.sqrt(d) / g
            order = np.argsort(-cs); taken = 0; chosen = np.zeros(ncell, bool)
            for c in order:
                if ccnt[c] == 0: continue
                if taken + ccnt[c] > budget and taken > 0: break
                chosen[c] = True; taken += ccnt[c]
            out[f'cells S={S}'] = captured(chosen[cell])
            # two-level: the buckets live-mean ranks first (twice what fits), then their cells
            lm = smx(logn + Qr @ mu.T / np.sqrt(d)).sum(0)
            order = np.argsort(-lm); taken = 0; top = []
            for c in order:
                if cnt[c] == 0: continue
                if taken > 2 * budget: break
                top.append(c); taken += cnt[c]
            top = np.array(top)
            nseg = (p + S) // S
            cand_cells = (top[:, None] * nseg + np.arange(nseg)[None, :]).ravel()
            cand_cells = cand_cells[ccnt[cand_cells] > 0]
            sc2 = smx(np.log(ccnt[cand_cells]) + Qr @ cmu[cand_cells].T / np.sqrt(d)).sum(0)
            order = cand_cells[np.argsort(-sc2)]; taken = 0; chosen = np.zeros(ncell, bool)
            for c in order:
                if taken + ccnt[c] > budget and taken > 0: break
                chosen[c] = True; taken += ccnt[c]
            out[f'2-level S={S}'] = captured(chosen[cell])
            res.setdefault(f'cells scored S={S}', []).append((len(cand_cells), 0))
        # quest pages of 16 over cand (pages aligned on absolute positions)
        pg = cand // 16
        pages = np.unique(pg)
        sc = np.zeros(len(pages))
        for j, P in enumerate(pages):
            rows = Kr[cand[pg == P]]
            lo, hi = rows.min(0), rows.max(0)
            sc[j] = np.maximum(Qr*lo, Qr*hi).sum()
        order = pages[np.argsort(-sc)]
        sel = np.isin(pg, order[:budget//16]); out['quest'] = captured(sel)
        # token oracle
        tm = A[:, cand].sum(0); sel = np.zeros(len(cand), bool); sel[np.argsort(-tm)[:budget]] = True
        out['token oracle'] = captured(sel)
        for k, v in out.items(): res.setdefault(k, []).append(v)
  print(f'layer {layer} done', flush=True)
for k, v in res.items():
    v = np.array(v); print(f'{k:16s} mass {v[:,0].mean():.3f}  read {v[:,1].mean()*100:.2f}%')
