"""Binary codes: packing, Hamming k-nearest-neighbour search, Euclidean ground truth and
retrieval precision / recall."""

from __future__ import annotations

import numpy as np

from . import _kernels


def pack_codes(Z) -> np.ndarray:
    """Pack binary codes ``(n, L)`` (bool or 0/1) into bytes ``(n, ceil(L / 8))``, bit ``l``
    of a code in bit ``l % 8`` of byte ``l // 8``."""
    Z = np.asarray(Z)
    if Z.ndim != 2:
        raise ValueError(f"codes must be a 2-D array (points x bits), got shape {Z.shape}")
    if Z.dtype != bool and not np.isin(Z, (0, 1)).all():
        raise ValueError("codes must hold only 0 and 1")
    return np.packbits(Z.astype(bool), axis=1, bitorder="little")


def unpack_codes(packed, n_bits: int) -> np.ndarray:
    """The inverse of `pack_codes`: uint8 0/1 array ``(n, n_bits)``."""
    packed = np.asarray(packed, dtype=np.uint8)
    return np.unpackbits(packed, axis=1, count=n_bits, bitorder="little")


def _words(packed: np.ndarray) -> np.ndarray:
    n, nbytes = packed.shape
    W = -(-nbytes // 8)
    out = np.zeros((n, W * 8), dtype=np.uint8)
    out[:, :nbytes] = packed
    return out.view(np.uint64)


def hamming_search(query_codes, codes, k: int, n_bits: int | None = None):
    """The ``k`` nearest database codes of every query in Hamming distance.

    Parameters
    ----------
    query_codes, codes : uint8 arrays (packed, as `pack_codes` or ``transform`` return)
    k : int
        Neighbours per query, ``1 <= k <= len(codes)``.
    n_bits : int, optional
        Code length (defaults to 8 bytes' worth); only bounds the distances.

    Returns
    -------
    indices : int64 array (n_queries, k), nearest first, ties in database order
    distances : int32 array (n_queries, k)
    """
    Q = np.asarray(query_codes)
    D = np.asarray(codes)
    for name, a in (("query_codes", Q), ("codes", D)):
        if a.ndim != 2 or a.dtype != np.uint8:
            raise ValueError(f"{name} must be packed uint8 codes (n, bytes), got "
                             f"{a.dtype} {a.shape}")
    if Q.shape[1] != D.shape[1]:
        raise ValueError(f"query codes have {Q.shape[1]} bytes, database codes "
                         f"{D.shape[1]}: not the same code length")
    if not 1 <= int(k) <= D.shape[0]:
        raise ValueError(f"k must be in [1, {D.shape[0]}] (the database size), got {k}")
    bits = int(n_bits) if n_bits is not None else 8 * D.shape[1]
    idx = np.empty((Q.shape[0], int(k)), dtype=np.int64)
    dist = np.empty((Q.shape[0], int(k)), dtype=np.int32)
    _kernels.hamming_knn(_words(Q), _words(D), int(k), idx, dist, bits)
    return idx, dist


def euclidean_neighbors(queries, X, k: int, *, chunk: int = 1024) -> np.ndarray:
    """Exact ``k`` nearest rows of ``X`` for each query, nearest first (squared Euclidean
    distance), computed in chunks of queries: the ground truth of retrieval."""
    queries = np.asarray(queries, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    if queries.ndim != 2 or X.ndim != 2 or queries.shape[1] != X.shape[1]:
        raise ValueError(f"queries {queries.shape} and database {X.shape} must be 2-D with "
                         f"the same number of features")
    if not 1 <= int(k) <= X.shape[0]:
        raise ValueError(f"k must be in [1, {X.shape[0]}], got {k}")
    x2 = np.einsum("ij,ij->i", X, X)
    out = np.empty((queries.shape[0], int(k)), dtype=np.int64)
    for s in range(0, queries.shape[0], chunk):
        q = queries[s:s + chunk]
        d = x2[None, :] - 2.0 * q @ X.T
        part = np.argpartition(d, int(k) - 1, axis=1)[:, :int(k)]
        rows = np.arange(len(q))[:, None]
        order = np.lexsort((part, d[rows, part]), axis=1)
        out[s:s + chunk] = part[rows, order]
    return out


def retrieval_precision(retrieved, relevant) -> tuple[float, float]:
    """Mean precision and recall of retrieved neighbour lists against relevant ones (e.g.
    Hamming top-k against Euclidean top-K): ``|retrieved & relevant| / k`` and ``/ K``.
    Each row of either lists distinct ids (as nearest-neighbour lists do)."""
    retrieved = np.asarray(retrieved)
    relevant = np.asarray(relevant)
    if retrieved.ndim != 2 or relevant.ndim != 2 or retrieved.shape[0] != relevant.shape[0]:
        raise ValueError(f"retrieved {retrieved.shape} and relevant {relevant.shape} must be "
                         f"(n_queries, k) arrays for the same queries")
    # each list holds distinct ids: an id in both lists of a query is an equal pair among
    # the query's sorted ids together (a loop of per-query intersections took 7x as long)
    both = np.sort(np.concatenate([retrieved, relevant], axis=1), axis=1)
    hits = (both[:, 1:] == both[:, :-1]).sum(axis=1, dtype=np.float64)
    return float(np.mean(hits / retrieved.shape[1])), float(np.mean(hits / relevant.shape[1]))
