"""Saddle problems stated per client, in plain torch (issue 46): each client's own function or matrices.

* :func:`client_saddle_problem`: ``min_x max_y (1/N) sum_i f(i, x, y, d_i)`` from one function ``f`` of the client
  index, the two players and client i's own data ``d_i``;
* :func:`quadratic_saddle_problem`: ``f_i(x, y) = 1/2 x'A_i x + x'B_i y - 1/2 y'C_i y + a_i'x - c_i'y`` from
  each client's matrices.

Client i holds one data row: its index and its data flattened (:class:`_Rows`), so its data stay on the client
(a Flower node receives only its own) and the local steps read the whole of it. The model
(:class:`SaddlePlayers`) holds x (block ``omega``) and y (block ``psi``); its output on a client's row is ``f_i``,
so the scored test loss of a model is the saddle value ``f(x, y)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fedsolve.core.context import TensorLoss
from fedsolve.core.rowwise import rowwise_mismatch
from fedsolve.data.federated import FederatedData
from fedsolve.families.minimax.saddle import OMEGA, PSI, check_concave, with_saddle_objective
from fedsolve.problems import FederatedProblem

__all__ = [
    "client_saddle_problem",
    "quadratic_saddle_problem",
    "ClientSaddleProblem",
    "SaddlePlayers",
    "quadratic_value",
]

#: a client-specific saddle function ``f(i, x, y, d) -> scalar``
SaddleFunction = Callable[[Tensor, Tensor, Tensor, Any], Tensor]


class SaddlePlayers(nn.Module):
    """The two players of a client-specific saddle problem as parameters ``x`` (omega) and ``y`` (psi).

    ``forward(rows)``: ``[n, 1]``, ``f_i(x, y)`` for the client ``i`` each row names (a client's one data row
    carries its index and its data, see :class:`_Rows`), so the test loss of a model is the clients' mean value
    ``f(x, y)``."""

    def __init__(self, x0: Tensor, y0: Tensor, value: Callable[[Tensor, Tensor, Tensor], Tensor]):
        super().__init__()
        self.x = nn.Parameter(x0.detach().clone())
        self.y = nn.Parameter(y0.detach().clone())
        self.value = value

    def forward(self, rows: Tensor) -> Tensor:
        return values(self.value, self.x, self.y, rows)


def values(value, x: Tensor, y: Tensor, rows: Tensor) -> Tensor:
    """``[n, 1]``: ``value(x, y, row)`` for each row of ``rows``."""
    return torch.stack([value(x, y, r) for r in rows.unbind(0)]).reshape(-1, 1)


class _Rows:
    """Client ``i``'s data ``d_i`` (a tensor, a tuple or a dict of tensors; the same shapes on every client) as one
    data row ``[i, d_i flattened...]`` in the players' float type, and back."""

    def __init__(self, data: Sequence[Any], dtype: torch.dtype):
        self.dtype = dtype
        first = data[0]
        self.kind = "dict" if isinstance(first, Mapping) else "seq" if isinstance(first, (tuple, list)) else "one"
        self.keys = list(first) if self.kind == "dict" else list(range(len(first))) if self.kind == "seq" else [None]
        self.specs = [(k, tuple(t.shape), t.dtype) for k, t in zip(self.keys, self._tensors(first, 0))]

    def _label(self, i: int, k) -> str:
        return f"data[{i}]" + ("" if k is None else f"[{k!r}]")

    def _tensors(self, d, i: int) -> list[Tensor]:
        if self.kind == "dict":
            if not isinstance(d, Mapping) or list(d) != self.keys:
                raise ValueError(
                    f"data[{i}]: keys {list(d) if isinstance(d, Mapping) else type(d).__name__} but "
                    f"client 0 has {self.keys}; allowed: the same keys on every client"
                )
            items = [d[k] for k in self.keys]
        elif self.kind == "seq":
            if not isinstance(d, (tuple, list)) or len(d) != len(self.keys):
                raise ValueError(f"data[{i}]: expected {len(self.keys)} tensors as client 0 has")
            items = list(d)
        else:
            items = [d]
        out = []
        for k, t in zip(self.keys, items):
            if not isinstance(t, Tensor):
                raise ValueError(f"{self._label(i, k)}: expected a torch tensor, got {type(t).__name__}")
            out.append(t)
        return out

    def row(self, i: int, d) -> Tensor:
        """Client ``i``'s row; checks its tensors against client 0's shapes and type, finite values."""
        parts = [torch.tensor([float(i)], dtype=self.dtype)]
        for (k, shape, dt), t in zip(self.specs, self._tensors(d, i)):
            where = self._label(i, k)
            if tuple(t.shape) != shape or t.dtype != dt:
                raise ValueError(
                    f"{where}: shape {tuple(t.shape)} {_name(t.dtype)} but client 0's is {shape} "
                    f"{_name(dt)}; allowed: the same shapes and types on every client"
                )
            if t.is_floating_point() and t.dtype != self.dtype:
                raise ValueError(
                    f"{where}: {_name(t.dtype)} but the start points are {_name(self.dtype)}; allowed: one float type"
                )
            if t.is_complex() or t.dtype == torch.bool:
                raise ValueError(f"{where}: {_name(t.dtype)}; allowed: real float or integer tensors")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"{where}: holds NaN/inf values; allowed: finite values only")
            flat = t.detach().reshape(-1).to(self.dtype)
            if not t.is_floating_point() and not torch.equal(flat.to(t.dtype), t.reshape(-1)):
                raise ValueError(
                    f"{where}: integers beyond what {_name(self.dtype)} holds exactly; allowed: smaller "
                    f"integers or float64 start points"
                )
            parts.append(flat)
        return torch.cat(parts)

    def unpack(self, row: Tensor) -> tuple[Tensor, Any]:
        """``(i, d_i)`` from a row (``i`` a 0-dim long tensor)."""
        out, at = [], 1
        for _, shape, dt in self.specs:
            n = 1
            for s in shape:
                n *= s
            t = row[at : at + n].reshape(shape)
            out.append(t if dt == self.dtype else t.round().to(dt))
            at += n
        i = row[0].round().long()
        if self.kind == "dict":
            return i, dict(zip(self.keys, out))
        return i, (tuple(out) if self.kind == "seq" else out[0])


class ClientSaddleProblem(FederatedProblem):
    """A saddle problem stated by a function per client (:func:`client_saddle_problem`)."""

    def players(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """``(x, y)`` of a flat parameter vector (e.g. ``RunResult.server["w"]``), in the start points' shapes."""
        p = self.layout.unflatten(w)
        return p["x"], p["y"]


def client_saddle_problem(
    f: SaddleFunction,
    x0: Tensor,
    y0: Tensor,
    data: Sequence[Any] | None = None,
    num_clients: int | None = None,
    name: str = "saddle",
) -> ClientSaddleProblem:
    """``min_x max_y (1/N) sum_i f(i, x, y, data[i])``: each client's own saddle function, in plain torch.

    ``f(i, x, y, d) -> scalar``: ``i`` is the client's index (a 0-dim integer tensor: index per-client tensors with
    it, ``A[i]``), ``x``/``y`` the players (shaped as ``x0``/``y0``, the start points), ``d`` client i's entry of
    ``data`` (a tensor, a tuple or a dict of tensors, the same shapes on every client; None when no ``data`` is
    given, then ``num_clients`` says how many clients there are). The local steps take the full ``d`` (one data
    row per client). ``f`` is written in tensor operations, so that it runs for one client or for all at once
    (no Python ``if``, ``int()`` or list indexing on ``i`` or on tensor values: refused when the problem is
    built).

    Checked on every client: ``f`` gives a finite real scalar with finite gradients at the start point, and the
    data are finite; ``f``'s mean over the clients is concave in y at the start point (``saddle.check_concave``):
    the solvers need a concave max part."""
    return _client_problem(f, x0, y0, data, num_clients, name, concave=True)


def _client_problem(f, x0, y0, data, num_clients, name, concave: bool) -> ClientSaddleProblem:
    if not callable(f):
        raise ValueError(f"f: expected a function f(i, x, y, d), got {type(f).__name__}")
    for key, t in (("x0", x0), ("y0", y0)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.numel() == 0:
            raise ValueError(f"{key}: expected a non-empty float tensor (the start point), got {t!r:.60}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{key}: holds NaN/inf values; allowed: a finite start point")
    if x0.dtype != y0.dtype:
        raise ValueError(f"y0: {_name(y0.dtype)} but x0 is {_name(x0.dtype)}; allowed: one float type")
    if data is None:
        if not isinstance(num_clients, int) or num_clients < 1:
            raise ValueError(f"num_clients: expected a positive integer when no data is given, got {num_clients!r}")
        data = [torch.zeros(0, dtype=x0.dtype)] * num_clients
        given = False
    else:
        if isinstance(data, (Tensor, Mapping)) or not isinstance(data, Sequence) or len(data) == 0:
            raise ValueError("data: expected a list with one entry per client (a tensor, a tuple or a dict of tensors)")
        if num_clients is not None and num_clients != len(data):
            raise ValueError(f"num_clients: {num_clients} but data lists {len(data)} clients")
        given = True
    packer = _Rows(data, x0.dtype)
    rows = torch.stack([packer.row(i, d) for i, d in enumerate(data)])

    def value(x: Tensor, y: Tensor, row: Tensor) -> Tensor:
        i, d = packer.unpack(row)
        return f(i, x, y, d if given else None)

    _check_values(value, x0, y0, rows)
    n = rows.shape[0]
    zeros = torch.zeros(n, 1, dtype=x0.dtype)
    off = torch.arange(n + 1)
    fdata = FederatedData(rows, zeros, off, rows.clone(), zeros.clone(), off.clone(), task="regression", name=name)
    problem = ClientSaddleProblem(
        data=fdata,
        model_fn=lambda: SaddlePlayers(x0, y0, value),
        loss=saddle_value,
        blocks={OMEGA: ["x"], PSI: ["y"]},
        name=name,
    )
    why = rowwise_mismatch(lambda r: values(value, x0, y0, r.unsqueeze(0)), rows)
    if why is not None:
        raise ValueError(
            f"f: {why}; allowed: tensor operations on i, x, y and d (index tensors with i, A[i]; no "
            f"Python if, int() or list indexing on i or on tensor values)"
        )
    if concave:
        shape = y0.shape
        check_concave(
            lambda yv: torch.stack([value(x0, yv.reshape(shape), r).reshape(()) for r in rows.unbind(0)]).mean(),
            y0,
            "f",
        )

    def saddle(p: dict[str, Tensor], r: Tensor, _: Tensor, w: Tensor) -> Tensor:
        return (w * values(value, p["x"], p["y"], r).reshape(-1)).sum()

    saddle.__qualname__ = f"client_saddle[{getattr(f, '__qualname__', type(f).__name__)}]"  # names the objective
    return with_saddle_objective(problem, lambda layout: TensorLoss(layout, saddle), name)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def saddle_value(out: Tensor, y: Tensor) -> Tensor:
    """The per-row "loss" of a client saddle problem: the model's output ``f_i(x, y)`` itself."""
    return out.reshape(out.shape[0])


def _check_values(value, x0: Tensor, y0: Tensor, rows: Tensor) -> None:
    """Every client's ``f`` at the start point: a finite real scalar, finite gradients in x and y."""
    for i, row in enumerate(rows.unbind(0)):
        x, y = x0.detach().clone().requires_grad_(True), y0.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            v = value(x, y, row)
            if not isinstance(v, Tensor) or v.numel() != 1 or not v.is_floating_point():
                got = f"shape {tuple(v.shape)} {_name(v.dtype)}" if isinstance(v, Tensor) else type(v).__name__
                raise ValueError(f"f: client {i} returned {got}; allowed: a real scalar tensor")
            if not bool(torch.isfinite(v).all()):
                raise ValueError(
                    f"f: client {i}'s value at the start point is {float(v.detach())}; allowed: finite values"
                )
            gx, gy = torch.autograd.grad(v.reshape(()), (x, y), allow_unused=True)
        for key, g in (("x", gx), ("y", gy)):
            if g is not None and not bool(torch.isfinite(g).all()):
                raise ValueError(
                    f"f: client {i}'s gradient in {key} at the start point holds NaN/inf; allowed: a "
                    f"function differentiable there"
                )


# ------------------------------------------------------------------ the quadratic case
def quadratic_saddle_problem(
    A, B, C, a=None, c=None, x0: Tensor | None = None, y0: Tensor | None = None, name: str = "quadratic_saddle"
) -> ClientSaddleProblem:
    """``f_i(x, y) = 1/2 x'A_i x + x'B_i y - 1/2 y'C_i y + a_i'x - c_i'y`` from each client's matrices.

    ``A``, ``B``, ``C``: one matrix per client (lists, or tensors ``[N, dx, dx]``, ``[N, dx, dy]``,
    ``[N, dy, dy]``); ``a``, ``c``: vectors per client (default 0); ``x0``, ``y0``: the start (default 0). ``A_i``
    and ``C_i`` must be symmetric, and the clients' means strongly convex / concave (mean A and mean C positive
    definite; single clients may be indefinite): then the saddle point is unique, the solution of
    ``[mean A, mean B; mean B', -mean C] [x; y] = [-mean a; mean c]``."""
    A, B, C = (_stack(key, v) for key, v in (("A", A), ("B", B), ("C", C)))
    n, dx, dy = A.shape[0], A.shape[-1], C.shape[-1]
    a = torch.zeros(n, dx, dtype=A.dtype) if a is None else _stack("a", a)
    c = torch.zeros(n, dy, dtype=A.dtype) if c is None else _stack("c", c)
    want = {"A": (n, dx, dx), "B": (n, dx, dy), "C": (n, dy, dy), "a": (n, dx), "c": (n, dy)}
    for key, t in zip(want, (A, B, C, a, c)):
        if tuple(t.shape) != want[key] or t.dtype != A.dtype:
            raise ValueError(
                f"{key}: shape {tuple(t.shape[1:])} {_name(t.dtype)} on {t.shape[0]} clients; allowed: "
                f"{want[key][1:]} {_name(A.dtype)} on each of the {n} clients (A is {dx}x{dx}, C "
                f"{dy}x{dy})"
            )
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t.reshape(t.shape[0], -1))).any(-1).nonzero()[0])
            raise ValueError(f"{key}: client {bad}'s entries hold NaN/inf; allowed: finite values only")
    for key, t, part in (
        ("A", A, "min part is not strongly convex in x"),
        ("C", C, "max part is not strongly concave in y"),
    ):
        asym = (t - t.transpose(-1, -2)).abs().amax((-1, -2))
        if bool((asym > 1e-12 * max(1.0, float(t.abs().max()))).any()):
            raise ValueError(
                f"{key}: client {int(asym.argmax())}'s matrix is not symmetric (max |{key} - {key}'| = "
                f"{float(asym.max()):.3g}); allowed: symmetric matrices"
            )
        low = float(torch.linalg.eigvalsh(t.mean(0).double()).min())
        if low <= 0:
            raise ValueError(
                f"{key}: the clients' mean {key} has the eigenvalue {low:.3g} <= 0: the {part}, so "
                f"no unique saddle point exists (the iterates run off along it, whatever the step "
                f"size); allowed: mean {key} positive definite"
            )
    x0 = torch.zeros(dx, dtype=A.dtype) if x0 is None else x0
    y0 = torch.zeros(dy, dtype=A.dtype) if y0 is None else y0
    data = [{"A": A[i], "B": B[i], "C": C[i], "a": a[i], "c": c[i]} for i in range(n)]
    return _client_problem(quadratic_value, x0, y0, data, None, name, concave=False)


def quadratic_value(i: Tensor, x: Tensor, y: Tensor, d: dict[str, Tensor]) -> Tensor:
    """``1/2 x'Ax + x'By - 1/2 y'Cy + a'x - c'y`` with client i's matrices ``d``."""
    return 0.5 * x @ d["A"] @ x + x @ d["B"] @ y - 0.5 * y @ d["C"] @ y + d["a"] @ x - d["c"] @ y


def _stack(key: str, v) -> Tensor:
    """One tensor ``[N, ...]`` from a list of per-client tensors (or such a tensor)."""
    if isinstance(v, Tensor):
        t = v
    elif isinstance(v, Sequence) and len(v) and all(isinstance(m, Tensor) for m in v):
        shapes = {tuple(m.shape) for m in v}
        if len(shapes) != 1:
            first = tuple(v[0].shape)
            bad = next(i for i, m in enumerate(v) if tuple(m.shape) != first)
            raise ValueError(
                f"{key}: client {bad}'s is {tuple(v[bad].shape)} but client 0's is {first}; allowed: "
                f"the same shape on every client"
            )
        t = torch.stack(list(v))
    else:
        raise ValueError(f"{key}: expected a list of per-client tensors or one tensor [N, ...], got {type(v).__name__}")
    if not t.is_floating_point() or t.dim() < 2:
        raise ValueError(
            f"{key}: expected float tensors, one per client, got {_name(t.dtype)} of shape {tuple(t.shape)}"
        )
    return t
