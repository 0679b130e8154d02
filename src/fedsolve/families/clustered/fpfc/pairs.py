"""FPFC's server-side pair variables: the one pair update (eq. 6) and the two stores that keep it.

A pair (i, j) is kept as ``delta_ij`` (d_f floats) and ``s_ij`` (1 float): theta_ij = s_ij delta_ij and
v_ij / rho = (1 - s_ij) delta_ij, so theta_ij - v_ij/rho = (2 s_ij - 1) delta_ij (see the package docstring).
:func:`pair_step` is the update itself; the dense store runs it either as tensor operations or, as its fast
path, the compiled kernel ``core/kernels/pair_update.c`` (the same arithmetic in two passes; tests compare
the two); the sparse store and the newcomers' server (``newcomers.py``) call :func:`pair_step` directly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedsolve.core import native


def pair_step(
    w_p: Tensor, w_q: Tensor, delta: Tensor, scale: Tensor, prox_fn: Callable[[Tensor], Tensor]
) -> tuple[Tensor, Tensor]:
    """One ADMM pair update in the (delta, s) representation, any leading shape.

    v_old/rho = (1 - s_old) delta_old;  delta_new = w_p - w_q + v_old/rho;  s_new = prox_scale(||delta_new||)
    (so theta_new = s_new delta_new and v_new/rho = delta_new - theta_new).
    """
    d_new = torch.addcmul(w_p - w_q, (1 - scale).unsqueeze(-1), delta)
    return d_new, prox_fn(d_new.norm(dim=-1))


# ====================================================================== server-side pair stores
def _touched_pairs(ids: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """Unordered pairs (p < q) with p or q in ``ids``, each once (row-major over ids)."""
    k = ids.numel()
    is_act = torch.zeros(m, dtype=torch.bool)
    is_act[ids] = True
    I = ids.unsqueeze(1).expand(k, m)
    J = torch.arange(m).unsqueeze(0).expand(k, m)
    keep = (I != J) & (~is_act[J] | (I < J))
    I, J = I[keep], J[keep]
    return torch.minimum(I, J), torch.maximum(I, J)


class DensePairs:
    """theta/v for all pairs as an antisymmetric ``[m, m, d_f]`` delta and ``[m, m]`` scale.

    The update runs the compiled ``core/kernels/pair_update.c`` (two passes over the touched pairs) for
    float32 stores where a C compiler is found and the run's ``kernel`` is not ``torch``, else
    :meth:`update_torch`; the two agree to float rounding (tests/test_fpfc.py)."""

    @staticmethod
    def init(m: int, df: int, dtype) -> dict[str, Tensor]:
        return {"delta": torch.zeros(m, m, df, dtype=dtype), "scale": torch.zeros(m, m, dtype=dtype)}

    @staticmethod
    def compiled(dtype: torch.dtype, kernel: str = "auto"):
        """The compiled pair kernel for a store of ``dtype`` under the run's ``kernel``, or None (torch)."""
        return native.load("pair_update") if dtype == torch.float32 and kernel != "torch" else None

    @staticmethod
    def update(st: dict[str, Tensor], Wf: Tensor, ids: Tensor, prox_fn, kernel: str = "auto") -> None:
        """In place: rows ``ids`` (and their antisymmetric columns) and the row sums ``R``."""
        contiguous = st["delta"].is_contiguous() and st["scale"].is_contiguous()
        lib = DensePairs.compiled(st["delta"].dtype, kernel) if contiguous else None
        if lib is None:
            DensePairs.update_torch(st, Wf, ids, prox_fn)
        else:
            DensePairs.update_native(lib, st, Wf, ids, prox_fn)

    @staticmethod
    def update_native(lib, st: dict[str, Tensor], Wf: Tensor, ids: Tensor, prox_fn) -> None:
        """:meth:`update` by the compiled kernel: pass 1 forms every touched delta and its norm, the prox
        scales come from ``prox_fn``, pass 2 writes the pairs and the row sums (see pair_update.c)."""
        delta, scale, R = st["delta"], st["scale"], st["R"]
        m, d = Wf.shape
        k = ids.numel()
        ids = ids.to(torch.int64).contiguous()
        Wf = Wf.to(torch.float32).contiguous()
        nth = max(1, min(torch.get_num_threads(), k))
        parts = [(k * t // nth, k * (t + 1) // nth) for t in range(nth)]
        Dn, r2 = torch.empty(k, m, d), torch.empty(k, m)
        col_old = [torch.zeros(m, d) for _ in parts]
        P = native.pointer
        native.parallel(
            lambda t: lib.pair_delta(P(delta), P(scale), P(Wf), m, d, P(ids), *parts[t], P(Dn), P(r2), P(col_old[t])),
            range(len(parts)),
        )
        S_new = prox_fn(r2.sqrt()).to(torch.float32).contiguous()
        active = torch.zeros(m, dtype=torch.uint8)
        active[ids] = 1
        row = torch.empty(k, d)
        col_new = [torch.zeros(m, d) for _ in parts]
        native.parallel(
            lambda t: lib.pair_write(
                P(delta), P(scale), P(Dn), P(S_new), m, d, P(ids), P(active), *parts[t], P(row), P(col_new[t])
            ),
            range(len(parts)),
        )
        R.sub_(torch.stack(col_new).sum(0) - torch.stack(col_old).sum(0))  # rows j: entries (j, i) = -(i, j)
        R.index_copy_(0, ids, row)  # rows i in ids: recomputed whole

    @staticmethod
    def update_torch(st: dict[str, Tensor], Wf: Tensor, ids: Tensor, prox_fn) -> None:
        """:meth:`update` in tensor operations (the reference)."""
        D_old = st["delta"].index_select(0, ids)  # [k, m, d]
        S_old = st["scale"].index_select(0, ids)  # [k, m]
        D_new, S_new = pair_step(Wf.index_select(0, ids).unsqueeze(1), Wf.unsqueeze(0), D_old, S_old, prox_fn)
        # change of theta_ij - v_ij/rho = (2 s - 1) delta for the pairs (i in ids, j)
        E = (2 * S_new - 1).unsqueeze(-1) * D_new
        E.addcmul_((2 * S_old - 1).unsqueeze(-1), D_old, value=-1.0)
        R = st["R"]
        R_act = R.index_select(0, ids) + E.sum(1)  # rows i in ids: all their pairs
        R.sub_(E.sum(0))  # rows j: entries (j, i) = -(i, j)
        R.index_copy_(0, ids, R_act)
        st["delta"].index_copy_(1, ids, D_new.neg().transpose(0, 1))
        st["delta"].index_copy_(0, ids, D_new)
        st["scale"].index_copy_(1, ids, S_new.transpose(0, 1))
        st["scale"].index_copy_(0, ids, S_new)

    @staticmethod
    def norms(st: dict[str, Tensor], m: int) -> Tensor:
        """``[m, m]`` matrix of ||theta_ij||."""
        return st["scale"].abs() * st["delta"].norm(dim=-1)

    @staticmethod
    def theta_v(st, m: int, rho: float) -> tuple[Tensor, Tensor]:
        D, S = st["delta"], st["scale"].unsqueeze(-1)
        return S * D, rho * (1 - S) * D


class SparsePairs:
    """Only the pairs touched so far: a growing pool keyed by ``p * m + q`` (p < q)."""

    @staticmethod
    def init(m: int, df: int, dtype) -> dict[str, Tensor]:
        return {
            "pair_key": torch.zeros(0, dtype=torch.long),
            "delta": torch.zeros(0, df, dtype=dtype),
            "scale": torch.zeros(0, dtype=dtype),
        }

    @staticmethod
    def slots(st: dict[str, Tensor], keys: Tensor) -> Tensor:
        """Pool slots of ``keys``, appending zero entries for keys never touched before."""
        pool = st["pair_key"]
        P = pool.numel()
        slot = torch.full_like(keys, -1)
        if P:
            sk, order = torch.sort(pool)
            pos = torch.searchsorted(sk, keys).clamp_max(P - 1)
            found = sk[pos] == keys
            slot = torch.where(found, order[pos], slot)
        new = slot < 0
        n_new = int(new.sum())
        if n_new:
            slot[new] = torch.arange(P, P + n_new)
            st["pair_key"] = torch.cat([pool, keys[new]])
            for k in ("delta", "scale"):  # one new tensor (not zeros then a concatenation: half the peak)
                grown = st[k].new_zeros((P + n_new, *st[k].shape[1:]))
                grown[:P] = st[k]
                st[k] = grown
        return slot

    #: touched pairs updated per piece, in floats of delta (64 MB in float32): the pair work's memory is one
    #: piece, whatever the number of pairs a round touches (up to m(m-1)/2 when every device takes part)
    CHUNK_FLOATS = 2**24

    @staticmethod
    def update(st: dict[str, Tensor], Wf: Tensor, ids: Tensor, prox_fn, kernel: str = "auto") -> None:
        """In place, tensor operations only (``kernel`` is accepted for the common interface), the touched
        pairs in pieces of ``CHUNK_FLOATS`` (each pair is touched once per update, so the pieces are
        independent; only the order of the sums into ``R`` changes)."""
        m = Wf.shape[0]
        p, q = _touched_pairs(ids, m)
        slot = SparsePairs.slots(st, p * m + q)
        step = max(1, SparsePairs.CHUNK_FLOATS // max(1, Wf.shape[1]))
        for a in range(0, p.numel(), step):
            pp, qq, ss = p[a : a + step], q[a : a + step], slot[a : a + step]
            D_old, S_old = st["delta"][ss], st["scale"][ss]
            D_new, S_new = pair_step(Wf[pp], Wf[qq], D_old, S_old, prox_fn)
            E = (2 * S_new - 1).unsqueeze(-1) * D_new - (2 * S_old - 1).unsqueeze(-1) * D_old
            st["R"].index_add_(0, pp, E)
            st["R"].index_add_(0, qq, E.neg())
            st["delta"][ss] = D_new
            st["scale"][ss] = S_new

    @staticmethod
    def norms(st: dict[str, Tensor], m: int) -> Tensor:
        N = torch.zeros(m, m, dtype=st["delta"].dtype)
        key = st["pair_key"]
        if key.numel():
            nrm = st["scale"].abs() * st["delta"].norm(dim=-1)
            p, q = key // m, key % m
            N[p, q] = nrm
            N[q, p] = nrm
        return N

    @staticmethod
    def theta_v(st, m: int, rho: float) -> tuple[Tensor, Tensor]:
        df = st["delta"].shape[1]
        D = torch.zeros(m, m, df, dtype=st["delta"].dtype)
        S = torch.zeros(m, m, dtype=st["delta"].dtype)
        key = st["pair_key"]
        if key.numel():
            p, q = key // m, key % m
            D[p, q], D[q, p] = st["delta"], -st["delta"]
            S[p, q], S[q, p] = st["scale"], st["scale"]
        S = S.unsqueeze(-1)
        return S * D, rho * (1 - S) * D


PAIR_STORES: dict[str, type[DensePairs] | type[SparsePairs]] = {"dense": DensePairs, "sparse": SparsePairs}
