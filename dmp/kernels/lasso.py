"""Numba kernels for STRADS Lasso coordinate descent on CSC column blocks.

Conventions (shared by every kernel here):

* A column block is CSC: ``indptr`` (int64, p_b + 1), ``indices`` (int32 row ids),
  ``data`` (float64).  Columns are addressed by *local* index inside the block.
* The objective is scikit-learn's ``1/(2n) ||y - X w - b||^2 + alpha ||w||_1``, solved in the
  scaled form ``1/2 ||r||^2 + (n alpha) ||w||_1`` with ``r = y~ - X~ w``, where ``~`` means
  centred (when fitting an intercept) or unchanged (``means`` all zero).
* Centring is implicit: column ``j`` is ``x_j - means[j]``.  Because a centred residual sums
  to zero, ``x~_j . r = x_j . r``; the residual update ``r -= delta (x_j - means[j])`` is done
  sparsely on ``r`` plus a scalar ``shift`` (the true residual is ``r + shift``), so one
  coordinate update costs O(nnz(x_j)), not O(n).
"""

import numpy as np
from ._jit import njit


@njit(cache=True, nogil=True)
def soft_threshold(a, t):
    """Soft-thresholding operator ``sign(a) max(|a| - t, 0)``."""
    if a > t:
        return a - t
    if a < -t:
        return a + t
    return 0.0


@njit(cache=True, nogil=True, inline="always")
def _dense_dot(data, start, r):
    """``data[start:start + n] . r`` (``n = len(r)``) as four interleaved partial sums added
    in a fixed order: four chains of additions in flight instead of one, and the same
    rounding on every machine (no reassociation left to the compiler)."""
    n = r.shape[0]
    m = n - n % 4
    a0 = 0.0
    a1 = 0.0
    a2 = 0.0
    a3 = 0.0
    for i in range(0, m, 4):
        a0 += data[start + i] * r[i]
        a1 += data[start + i + 1] * r[i + 1]
        a2 += data[start + i + 2] * r[i + 2]
        a3 += data[start + i + 3] * r[i + 3]
    for i in range(m, n):
        a0 += data[start + i] * r[i]
    return (a0 + a1) + (a2 + a3)


@njit(cache=True, nogil=True)
def cd_sweep(indptr, indices, data, sq_norms, means, col_sums, w, r, idx, alpha_n, delta_out,
             dense=False):
    """Sequential (Gauss-Seidel) coordinate descent over the local columns ``idx``.

    Updates ``w`` and ``r`` in place; ``r`` must hold the true (centred) residual on entry and
    holds it again on exit (the centring shift is folded back at the end).

    Parameters
    ----------
    sq_norms : float64[p_b]
        Squared norms of the *centred* columns (``||x_j||^2 - n means_j^2``).
    means, col_sums : float64[p_b]
        Column means (zeros when no intercept) and column sums of the raw columns.
    idx : int64[k]
        Local column indices, updated in this order.
    alpha_n : float
        ``n * alpha``.
    delta_out : float64[k]
        Receives ``w_new - w_old`` for each scheduled column.
    dense : bool
        Every column is stored whole with its rows in order (column ``j`` is
        ``data[indptr[j]:indptr[j] + n]``): its dot product with ``r`` runs as `_dense_dot`
        (about 3x faster; rounded differently from the one-chain sum of a sparse column).

    Returns
    -------
    float
        Sum of |delta| over the sweep.
    """
    shift = 0.0
    total = 0.0
    for t in range(idx.shape[0]):
        j = idx[t]
        nrm = sq_norms[j]
        if nrm <= 0.0:
            delta_out[t] = 0.0
            continue
        start = indptr[j]
        stop = indptr[j + 1]
        if dense:
            dot = _dense_dot(data, start, r)
        else:
            dot = 0.0
            for q in range(start, stop):
                dot += data[q] * r[indices[q]]
        # x~_j . (r + shift) = x_j . r + shift * col_sum_j - means_j * sum(r + shift), and the
        # last sum is zero for a centred residual.
        dot += shift * col_sums[j]
        wj = w[j]
        new = soft_threshold(dot + nrm * wj, alpha_n) / nrm
        d = new - wj
        delta_out[t] = d
        if d != 0.0:
            w[j] = new
            if dense:
                for i in range(stop - start):
                    r[i] -= d * data[start + i]
            else:
                for q in range(start, stop):
                    r[indices[q]] -= d * data[q]
            shift += d * means[j]
            total += abs(d)
    if shift != 0.0:
        for i in range(r.shape[0]):
            r[i] += shift
    return total


@njit(cache=True, nogil=True)
def correlations(indptr, indices, data, r, out):
    """``out[j] = x_j . r`` for every local column (the gradient pass of the duality gap)."""
    for j in range(indptr.shape[0] - 1):
        acc = 0.0
        for q in range(indptr[j], indptr[j + 1]):
            acc += data[q] * r[indices[q]]
        out[j] = acc


@njit(cache=True, nogil=True)
def dense_correlations(data, n, r, out):
    """`correlations` of a block whose columns are stored whole, rows in order (column ``j``
    is ``data[j n:(j + 1) n]``): the same sums, bit for bit, four columns at a time, so that
    four chains of additions are in flight instead of one (5x faster at n = 400)."""
    p = out.shape[0]
    j = 0
    while j + 4 <= p:
        b0 = j * n
        b1 = b0 + n
        b2 = b1 + n
        b3 = b2 + n
        a0 = 0.0
        a1 = 0.0
        a2 = 0.0
        a3 = 0.0
        for i in range(n):
            ri = r[i]
            a0 += data[b0 + i] * ri
            a1 += data[b1 + i] * ri
            a2 += data[b2 + i] * ri
            a3 += data[b3 + i] * ri
        out[j] = a0
        out[j + 1] = a1
        out[j + 2] = a2
        out[j + 3] = a3
        j += 4
    for jj in range(j, p):
        acc = 0.0
        b = jj * n
        for i in range(n):
            acc += data[b + i] * r[i]
        out[jj] = acc


@njit(cache=True, nogil=True)
def gap_priorities(corr, sq_norms, w, alpha_n, prio):
    """``prio[j]``: the square of the step coordinate ``j`` would take from the current
    residual (no update applied), every variable's STRADS priority after a full gradient
    pass; returns ``max_j |corr[j]|``, the dual norm of the duality gap."""
    dual_norm = 0.0
    for j in range(corr.shape[0]):
        c = corr[j]
        if abs(c) > dual_norm:
            dual_norm = abs(c)
        nrm = sq_norms[j]
        if nrm <= 0.0:
            prio[j] = 0.0
        else:
            step = soft_threshold(c + nrm * w[j], alpha_n) / nrm - w[j]
            prio[j] = step * step
    return dual_norm


@njit(cache=True, nogil=True)
def block_matvec(indptr, indices, data, means, w, out):
    """``out += X~_b w_b`` (centred columns) for one column block."""
    shift = 0.0
    for j in range(indptr.shape[0] - 1):
        wj = w[j]
        if wj != 0.0:
            for q in range(indptr[j], indptr[j + 1]):
                out[indices[q]] += data[q] * wj
            shift += wj * means[j]
    if shift != 0.0:
        for i in range(out.shape[0]):
            out[i] -= shift


@njit(cache=True, nogil=True)
def dependency_filter(indptr, indices, data, means, sq_norms, cand, max_keep, rho, n_rows,
                      work_budget, row_head, link_next, link_col, link_val, kept_out):
    """Greedy STRADS dependency filter over the candidates ``cand`` (in priority order).

    Candidate ``k`` is kept if ``|corr(x_j, x_k)| < rho`` for every already kept ``j``, where
    corr is the cosine of the centred columns.  Inner products against the kept set are
    accumulated through a row-wise linked list of the kept columns' entries, so checking one
    candidate costs O(sum over its rows of the kept entries in that row), not O(|kept| nnz).
    Kept pairs that share no row still correlate through their means (``-n m_j m_k``); that
    part is bounded first and only checked pair by pair when the bound can fail.

    ``row_head`` (int64[n], all -1 on entry and restored to -1 on exit), ``link_next``,
    ``link_col`` (int64) and ``link_val`` (float64) are scratch buffers with room for the
    nnz of all kept columns.  Scanning stops once ``work_budget`` inner products terms have
    been accumulated (dense columns make the check quadratic); the kept set is then final, so
    every kept pair has still passed the test.  Returns the number kept; kept local indices go
    to ``kept_out``.
    """
    work = 0
    n_kept = 0
    n_links = 0
    acc = np.zeros(max_keep, dtype=np.float64)
    stamp = np.zeros(max_keep, dtype=np.int64)
    touched = np.empty(max_keep, dtype=np.int64)
    max_mean_ratio = 0.0  # max over kept j of |m_j| / ||x~_j||
    for t in range(cand.shape[0]):
        if n_kept >= max_keep:
            break
        k = cand[t]
        nk = sq_norms[k]
        if nk <= 0.0:
            continue
        if work > work_budget:
            break
        n_touched = 0
        for q in range(indptr[k], indptr[k + 1]):
            v = data[q]
            e = row_head[indices[q]]
            while e >= 0:
                slot = link_col[e]
                if stamp[slot] != t + 1:
                    stamp[slot] = t + 1
                    acc[slot] = 0.0
                    touched[n_touched] = slot
                    n_touched += 1
                acc[slot] += v * link_val[e]
                e = link_next[e]
                work += 1
        ok = True
        mk = means[k]
        sk = np.sqrt(nk)
        for s in range(n_touched):
            slot = touched[s]
            j = kept_out[slot]
            dot = acc[slot] - n_rows * means[j] * mk
            if abs(dot) >= rho * np.sqrt(sq_norms[j]) * sk:
                ok = False
                break
        if ok and mk != 0.0 and n_rows * abs(mk) / sk * max_mean_ratio >= rho:
            for slot in range(n_kept):
                if stamp[slot] == t + 1:
                    continue
                j = kept_out[slot]
                if n_rows * abs(means[j] * mk) >= rho * np.sqrt(sq_norms[j]) * sk:
                    ok = False
                    break
        if not ok:
            continue
        kept_out[n_kept] = k
        ratio = abs(mk) / sk
        if ratio > max_mean_ratio:
            max_mean_ratio = ratio
        for q in range(indptr[k], indptr[k + 1]):
            i = indices[q]
            link_col[n_links] = n_kept
            link_val[n_links] = data[q]
            link_next[n_links] = row_head[i]
            row_head[i] = n_links
            n_links += 1
        n_kept += 1
    for s in range(n_kept):
        k = kept_out[s]
        for q in range(indptr[k], indptr[k + 1]):
            row_head[indices[q]] = -1
    return n_kept


def cd_sweeps(indptr, indices, data, sq_norms, means, col_sums, w, r, idx, alpha_n,
              max_sweeps, rel_tol, delta_out, dense=False):
    """Up to ``max_sweeps`` sequential sweeps of :func:`cd_sweep` over ``idx`` (a working-set
    solve), stopping early once a sweep's largest step is at most ``rel_tol`` times the
    largest coefficient of the set.  ``delta_out`` receives the total change per column;
    ``dense`` as for `cd_sweep`.  Returns the number of sweeps run."""
    k = idx.shape[0]
    return _cd_sweeps(indptr, indices, data, sq_norms, means, col_sums, w, r, idx, alpha_n,
                      max_sweeps, rel_tol, delta_out, dense, np.empty(k), np.empty(k))


# (the `_` kernels below take their arrays from their callers: dmp.kernels._jit)
@njit(cache=True, nogil=True)
def _cd_sweeps(indptr, indices, data, sq_norms, means, col_sums, w, r, idx, alpha_n,
               max_sweeps, rel_tol, delta_out, dense, w_old, step):
    k = idx.shape[0]
    for t in range(k):
        w_old[t] = w[idx[t]]
    sweeps = 0
    for s in range(max_sweeps):
        cd_sweep(indptr, indices, data, sq_norms, means, col_sums, w, r, idx, alpha_n, step,
                 dense)
        sweeps += 1
        d_max = 0.0
        w_max = 0.0
        for t in range(k):
            a = abs(step[t])
            if a > d_max:
                d_max = a
            b = abs(w[idx[t]])
            if b > w_max:
                w_max = b
        if d_max <= rel_tol * w_max:
            break
    for t in range(k):
        delta_out[t] = w[idx[t]] - w_old[t]
    return sweeps


def gather_columns(indptr, indices, data, idx):
    """Copy the columns ``idx`` into a new contiguous CSC block (a working-set copy whose
    repeated sweeps then read memory sequentially)."""
    k = idx.shape[0]
    ip = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(np.asarray(indptr[idx + 1] - indptr[idx], dtype=np.int64), out=ip[1:])
    ind = np.empty(ip[k], dtype=indices.dtype)
    dat = np.empty(ip[k], dtype=data.dtype)
    _gather_columns(indptr, indices, data, idx, ip, ind, dat)
    return ip, ind, dat


@njit(cache=True, nogil=True)
def _gather_columns(indptr, indices, data, idx, ip, ind, dat):
    k = idx.shape[0]
    for t in range(k):
        j = idx[t]
        q0 = ip[t]
        for q in range(indptr[j], indptr[j + 1]):
            ind[q0] = indices[q]
            dat[q0] = data[q]
            q0 += 1


@njit(cache=True, nogil=True)
def _select_smallest(keys, ids, k):
    """Reorder ``keys`` and ``ids`` together so that the ``k`` smallest keys come first (in
    no particular order): Wirth's quickselect with a median-of-three pivot."""
    lo = 0
    hi = keys.shape[0] - 1
    target = k - 1
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < keys[lo]:
            keys[mid], keys[lo] = keys[lo], keys[mid]
            ids[mid], ids[lo] = ids[lo], ids[mid]
        if keys[hi] < keys[lo]:
            keys[hi], keys[lo] = keys[lo], keys[hi]
            ids[hi], ids[lo] = ids[lo], ids[hi]
        if keys[hi] < keys[mid]:
            keys[hi], keys[mid] = keys[mid], keys[hi]
            ids[hi], ids[mid] = ids[mid], ids[hi]
        pivot = keys[mid]
        i = lo
        j = hi
        while i <= j:
            while keys[i] < pivot:
                i += 1
            while keys[j] > pivot:
                j -= 1
            if i <= j:
                keys[i], keys[j] = keys[j], keys[i]
                ids[i], ids[j] = ids[j], ids[i]
                i += 1
                j -= 1
        if target <= j:
            hi = j
        elif target >= i:
            lo = i
        else:
            break


@njit(cache=True, nogil=True)
def priority_keys_top(prio, live, floor, n_dead, e_live, e_dead, k, keys, ids):
    """The ``k`` smallest exponential keys of STRADS' priority sampling (`priority_sample`):
    ``e_live[i] / (prio[live[i]] + floor)`` for the moving variables, and the first
    ``len(e_dead)`` order statistics of the ``n_dead`` settled variables' keys (Renyi's
    representation, cumulated ``e_dead[j] / (floor (n_dead - j))``).  Leaves the chosen
    moving variables in ``ids[:k - c]`` and returns ``c``, how many settled ones were
    chosen (``keys`` and ``ids`` are work buffers of ``len(live) + len(e_dead)``)."""
    n_live = live.shape[0]
    for i in range(n_live):
        keys[i] = e_live[i] / (prio[live[i]] + floor)
        ids[i] = live[i]
    acc = 0.0
    for j in range(e_dead.shape[0]):
        acc += e_dead[j] / (floor * (n_dead - j))
        keys[n_live + j] = acc
        ids[n_live + j] = -1
    if k < keys.shape[0]:
        _select_smallest(keys, ids, k)
    m = 0
    for i in range(k):
        if ids[i] >= 0:
            ids[m] = ids[i]
            m += 1
    return k - m


@njit(cache=True, nogil=True)
def uniform_settled(prio, u, c, ids):
    """``c`` settled variables (``prio == 0``), those of the ``c`` smallest of their uniform
    keys ``u`` (one per settled variable, in variable order): a uniform subset, left in
    ``ids[:c]`` (``ids`` a work buffer of ``len(u)``)."""
    m = 0
    for j in range(prio.shape[0]):
        if prio[j] == 0.0:
            ids[m] = j
            m += 1
    if c < m:
        _select_smallest(u, ids, c)
