"""Numba kernels of binary hashing: Hamming search on packed codes and the BA Z step.

Codes are packed little-endian within bytes (`numpy.packbits(..., bitorder="little")`) and
viewed as uint64 words, so a Hamming distance is a few XOR/popcounts.

The Z step minimises, for each point, ``e(z) = ||c - R z||^2 + mu * Hamming(z, h)`` over
``z in {0, 1}^L``, where ``B = Q R`` is the thin QR of the decoder matrix and
``c = Q^T (x - b)`` -- the BA objective ``||x - B z - b||^2 + mu ||z - h(x)||^2`` up to a
constant, at O(L^2) rather than O(D L) per evaluation.
"""

from __future__ import annotations

import numpy as np

from dmp.kernels._jit import njit

_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)


@njit(cache=True, nogil=True, inline="always")
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return (x * _H01) >> np.uint64(56)


def hamming_knn(queries, codes, k, out_idx, out_dist, n_bits):
    """The ``k`` nearest codes of every query in Hamming distance (ties by index).

    ``queries`` (Q x W) and ``codes`` (N x W) are uint64 words; ``out_idx`` / ``out_dist``
    (Q x k) receive the neighbours in increasing distance.  Per query, one vectorised
    pass computes every distance (XOR, popcount), a second keeps a code (in the bucket of
    its distance, at most k per bucket, in index order) only when its distance is within
    ``cut``, which drops as soon as k codes are strictly nearer -- after the first few
    hundred codes nearly every one is rejected by one well-predicted comparison (a full
    histogram of the distances cost four times the popcounts: its increments serialise).
    """
    nb = n_bits + 1
    _hamming_knn(queries, codes, k, out_idx, out_dist, n_bits,
                 np.empty((nb, k), dtype=np.int64), np.empty(nb, dtype=np.int64),
                 np.empty(codes.shape[0], dtype=np.int32))


# (the `_` kernels below take their arrays from their callers: dmp.kernels._jit)
@njit(cache=True, nogil=True)
def _hamming_knn(queries, codes, k, out_idx, out_dist, n_bits, bucket, cnt, dist):
    n_q, W = queries.shape
    N = codes.shape[0]
    for q in range(n_q):
        # the distances first, in a branch-free loop LLVM vectorises ...
        if W == 1:
            qw = queries[q, 0]
            for i in range(N):
                dist[i] = _popcount(qw ^ codes[i, 0])
        else:
            for i in range(N):
                d = np.uint64(0)
                for w in range(W):
                    d += _popcount(queries[q, w] ^ codes[i, w])
                dist[i] = d
        # ... then the selection, which rejects nearly every code with one comparison
        cnt[:] = 0
        cut = n_bits
        below = 0                      # codes kept at distances < cut
        for i in range(N):
            d = dist[i]
            if d > cut:
                continue
            c = cnt[d]
            if c < k:
                bucket[d, c] = i
            cnt[d] = c + 1
            if d < cut:
                below += 1
                while cut > 0 and below >= k:
                    cut -= 1
                    below -= cnt[cut]
        pos = 0
        for d in range(cut + 1):
            take = min(cnt[d], k - pos)
            for j in range(take):
                out_idx[q, pos] = bucket[d, j]
                out_dist[q, pos] = d
                pos += 1
            if pos == k:
                break


def z_enumerate(C, R, H, mu, Z):
    """Exact Z step: every code of every point, in Gray-code order (one column of ``R``
    added or taken per code: O(2^L L) per point); ties keep the first code found, which
    starts at ``h``.  ``C`` (N x L), ``R`` (L x L upper triangular), ``H``/``Z`` (N x L
    uint8); writes ``Z`` and returns nothing."""
    L = C.shape[1]
    _z_enumerate(C, R, H, mu, Z, np.empty(L), np.empty(L, H.dtype), np.empty(L, H.dtype))


@njit(cache=True, nogil=True)
def _z_enumerate(C, R, H, mu, Z, r, cur, best):
    N, L = C.shape
    for n in range(N):
        # start at z = h: residual c - R h
        hv = H[n]
        for a in range(L):
            s = C[n, a]
            for b in range(L):
                if hv[b]:
                    s -= R[a, b]
            r[a] = s
        # (element loops: an array assigned to a slice is an allocating step, dmp.kernels._jit)
        for b in range(L):
            cur[b] = hv[b]
            best[b] = hv[b]
        ham = 0
        best_e = 0.0
        for a in range(L):
            best_e += r[a] * r[a]
        for g in range(1, 1 << L):
            # the bit that changes between Gray codes g - 1 and g
            bit = 0
            t = g
            while (t & 1) == 0:
                t >>= 1
                bit += 1
            if cur[bit]:
                cur[bit] = 0
                for a in range(L):
                    r[a] += R[a, bit]
            else:
                cur[bit] = 1
                for a in range(L):
                    r[a] -= R[a, bit]
            ham += 1 if cur[bit] != hv[bit] else -1
            e = mu * ham
            if e >= best_e:
                continue
            for a in range(L):
                e += r[a] * r[a]
            if e < best_e:
                best_e = e
                for b in range(L):
                    best[b] = cur[b]
        for b in range(L):
            Z[n, b] = best[b]


def z_objective_qr(C, R, H, mu, Z, out):
    """``out[n] = ||c_n - R z_n||^2 + mu * Hamming(z_n, h_n)``."""
    _z_objective_qr(C, R, H, mu, Z, out, np.empty(C.shape[1]))


@njit(cache=True, nogil=True, fastmath=True)
def _z_objective_qr(C, R, H, mu, Z, out, zf):
    N, L = C.shape
    for n in range(N):
        ham = 0
        for b in range(L):
            zf[b] = Z[n, b]
            ham += Z[n, b] != H[n, b]
        e = 0.0
        for a in range(L):
            s = C[n, a]
            for b in range(a, L):
                s -= R[a, b] * zf[b]
            e += s * s
        out[n] = e + mu * ham


def z_alternate(C, R, H, mu, Z, max_trials):
    """Alternating optimisation over bits, from the codes in ``Z``: flip bit ``i`` when it
    lowers the objective; stop after L consecutive positions without a change (or
    ``max_trials`` trials).  Never increases any point's objective."""
    L = C.shape[1]
    _z_alternate(C, R, H, mu, Z, max_trials, np.empty(L), np.empty(L), np.empty(L))


@njit(cache=True, nogil=True, fastmath=True)
def _z_alternate(C, R, H, mu, Z, max_trials, r, col2, zf):
    N, L = C.shape
    for b in range(L):
        s = 0.0
        for a in range(L):
            s += R[a, b] * R[a, b]
        col2[b] = s
    for n in range(N):
        for b in range(L):
            zf[b] = Z[n, b]
        for a in range(L):
            s = C[n, a]
            for b in range(a, L):
                s -= R[a, b] * zf[b]
            r[a] = s
        unchanged = 0
        trials = 0
        i = 0
        while unchanged < L and trials < max_trials:
            # flipping bit i moves the residual by -/+ R[:, i]
            dot = 0.0
            for a in range(i + 1):
                dot += r[a] * R[a, i]
            if Z[n, i]:
                delta = 2.0 * dot + col2[i]
            else:
                delta = -2.0 * dot + col2[i]
            delta += mu * (-1.0 if Z[n, i] != H[n, i] else 1.0)
            if delta < 0.0:
                if Z[n, i]:
                    Z[n, i] = 0
                    for a in range(i + 1):
                        r[a] += R[a, i]
                else:
                    Z[n, i] = 1
                    for a in range(i + 1):
                        r[a] -= R[a, i]
                unchanged = 0
            else:
                unchanged += 1
            trials += 1
            i = (i + 1) % L
