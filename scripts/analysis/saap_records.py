"""Shared helpers of the offline Saap studies: read `sparrow saap collect` records (.saapc,
format in crates/sparrow/src/saap/record.rs), apply RoPE, k-means the de-roped keys.

An analysis aid, not part of the engine or its tests. Needs numpy.
"""
import json, struct, numpy as np
def load(path):
    b = open(path,'rb').read()
    m = struct.unpack('<I', b[44:48])[0]
    meta = json.loads(b[48:48+m]); off = 48+m
    L, nh, kv, d, n = meta['n_layer'], meta['n_head'], meta['n_head_kv'], meta['head_dim'], meta['n_tokens']
    nq = len(meta['query_positions'])
    per = n*kv*d + nq*nh*d
    data = np.frombuffer(b, dtype='<f4', count=per*L, offset=off).reshape(L, per)
    keys = data[:, :n*kv*d].reshape(L, n, kv, d)
    qs = data[:, n*kv*d:].reshape(L, nq, nh, d)
    return meta, keys, qs
def rope(x, pos, base, d):
    half = d//2
    inv = base ** (-np.arange(half)*2.0/d)
    ang = np.outer(pos, inv)  # (n, half)
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1*c - x2*s, x1*s + x2*c], axis=-1)
def kmeans(X, C, it=10, seed=0):
    rng = np.random.default_rng(seed)
    if len(X) > 128*C: X = X[np.sort(rng.choice(len(X), 128*C, replace=False))]
    cen = X[rng.choice(len(X), C, replace=False)].copy()
    for _ in range(it):
        a = assign(X, cen)
        cnt = np.bincount(a, minlength=C)
        sums = np.zeros_like(cen); np.add.at(sums, a, X)
        nz = cnt > 0
        cen[nz] = sums[nz]/cnt[nz,None]
        cen[~nz] = X[rng.choice(len(X), (~nz).sum())]
    return cen
def assign(X, cen):
    out = []
    bias = -0.5*(cen**2).sum(1)
    for i in range(0, len(X), 8192):
        out.append(np.argmax(X[i:i+8192] @ cen.T + bias, axis=1))
    return np.concatenate(out)
