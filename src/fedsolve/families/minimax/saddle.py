"""Federated saddle problems: ``min_x max_y f(x, y) = (1/N) sum_i f_i(x, y)`` (FedMM eq. 3), x and y shared.

A minimax problem is a :class:`~fedsolve.problems.FederatedProblem` whose parameters fall into two named blocks of
its ``ParamLayout``: ``omega`` (the MIN player x) and ``psi`` (the MAX player y). ``problem.extras["minimax"]``
(:class:`Minimax`) holds the saddle objective ``f_i`` as a function of the whole flat parameter vector and one
weighted minibatch ``(rows, y, w)`` of the client's data. Three ways to state one:

* :func:`client_saddle_problem`: one plain torch function ``f(i, x, y, d)`` of the client index ``i``, the two
  players and client i's own data ``d`` (a tensor, a tuple or a dict of tensors per client);
* :func:`quadratic_saddle_problem`: ``f_i(x, y) = 1/2 x'A_i x + x'B_i y - 1/2 y'C_i y + a_i'x - c_i'y`` from the
  clients' matrices;
* :func:`saddle_problem`: an objective ``objective(omega, psi, (x, y, w))`` on minibatches of data rows and any
  model (stochastic local steps); adversarial domain adaptation (``problem.py``) is built this way.

Every client's data is checked finite when the problem is built, and the shapes of every client's function value
and data; :func:`client_saddle_problem` also checks that ``f`` is concave in y at the start point (the max part
the solvers need), so a run that still produces NaN/inf has a step size too large.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from fedsolve.core.context import TensorLoss
from fedsolve.core.rowwise import rowwise_mismatch
from fedsolve.data.federated import FederatedData
from fedsolve.problems import FederatedProblem

__all__ = ["OMEGA", "PSI", "Minimax", "minimax_of", "player_signs", "with_saddle_objective", "check_finite_data",
           "saddle_problem", "client_saddle_problem", "quadratic_saddle_problem", "ClientSaddleProblem"]

OMEGA, PSI = "omega", "psi"
Batch = tuple[Tensor, Tensor, Tensor]
#: ``f_i(params, x, y, w)``: the saddle objective on one weighted minibatch, ``params`` the flat vector
FlatObjective = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
#: a user's saddle objective ``objective(omega, psi, (x, y, w))`` on data rows
SaddleObjective = Callable[[Tensor, Tensor, Batch], Tensor]
#: a client-specific saddle function ``f(i, x, y, d) -> scalar``
SaddleFunction = Callable[[Tensor, Tensor, Tensor, Any], Tensor]
#: the largest max-player size whose Hessian the concavity check forms
CONCAVITY_CHECK_MAX = 2048


@dataclass(frozen=True)
class Minimax:
    """What a minimax solver needs besides the layout's ``omega``/``psi`` blocks.

    ``loss(params, x, y, w)``: ``f_i`` on one minibatch; omega descends it, psi ascends it.
    ``feature_scale``: factor on the step size of the ``features`` block where the solver has no explicit
    ``feature_lr`` (1 from scratch; 0.05 in the pretrained regime: 0.01 x 0.05 = the paper's 0.0005).
    ``psi_scale``: factor on psi's GRADIENT of ``f_i`` only (not on a solver's penalty or dual terms):
    1 in the paper; ``problem.psi_gradient_scale`` for the authors' code."""

    loss: FlatObjective
    name: str = "saddle"
    feature_scale: float = 1.0
    psi_scale: float = 1.0


def minimax_of(problem) -> Minimax:
    """The problem's minimax objective; a clear error for a problem that is not a minimax problem."""
    mm = getattr(problem, "extras", {}).get("minimax")
    if not isinstance(mm, Minimax):
        raise ValueError("problem: the minimax solvers need a minimax problem; allowed: problem: {kind: "
                         "domain_adaptation} in a config (with domain data), or a problem from "
                         "fedsolve.families.minimax (client_saddle_problem, quadratic_saddle_problem, saddle_problem)")
    return mm


def player_signs(layout) -> Tensor:
    """``[d]`` vector: +1 on omega (descent), -1 on psi (ascent); checks that the blocks split the model."""
    for b in (OMEGA, PSI):
        if not layout.has_block(b):
            raise ValueError(f"minimax problem: the layout has no {b!r} block; blocks: {layout.block_names()}")
    om, ps = layout.mask(OMEGA), layout.mask(PSI)
    if bool((om & ps).any()):
        raise ValueError(f"minimax problem: blocks 'omega' and 'psi' overlap on {int((om & ps).sum())} parameters")
    if not bool((om | ps).all()):
        left = [n for n in layout.names if n not in layout.block_params(OMEGA) + layout.block_params(PSI)]
        raise ValueError(f"minimax problem: parameters in neither 'omega' nor 'psi': {left}")
    return torch.where(om, 1.0, -1.0)


def with_saddle_objective(problem: FederatedProblem, loss_of_layout, name: str, feature_scale: float = 1.0,
                          psi_scale: float = 1.0, checked: bool = False) -> FederatedProblem:
    """``problem`` with its data checked finite (unless ``checked``: already done) and ``extras["minimax"]`` set to
    the objective ``loss_of_layout(layout)`` (the layout's ``omega``/``psi`` blocks checked to split the model)."""
    if not checked:
        check_finite_data(problem.data)
    player_signs(problem.layout)
    problem.extras["minimax"] = Minimax(loss_of_layout(problem.layout), name, feature_scale, psi_scale)
    return problem


def check_finite_data(data: FederatedData, roles: Mapping[str, str] | None = None) -> None:
    """Every client's training and test features (and real-valued targets) hold no NaN/inf; the error names the
    field, the first client and row. ``roles``: how the message names a field (e.g. ``test_x``: "target test
    images")."""
    roles = roles or {}
    fields = [("train_x", data.train_x, data.train_offsets), ("test_x", data.test_x, data.test_offsets)]
    fields += [(k, t, o) for k, t, o in (("train_y", data.train_y, data.train_offsets),
                                         ("test_y", data.test_y, data.test_offsets)) if t.is_floating_point()]
    for key, t, offsets in fields:
        if not t.is_floating_point():
            continue
        bad = ~torch.isfinite(t.reshape(t.shape[0], -1)).all(-1)
        if bool(bad.any()):
            row = int(bad.nonzero()[0])
            client = int(torch.searchsorted(offsets, torch.tensor(row), right=True)) - 1
            what = f" ({roles[key]})" if key in roles else ""
            raise ValueError(f"{key}{what}: client {client} holds NaN/inf values ({int(bad.sum())} row(s) in all, "
                             f"its row {row - int(offsets[client])} first); allowed: finite values only")


# ------------------------------------------------------------------ objectives on data rows
def saddle_problem(data: FederatedData, model_fn: Callable[[], nn.Module], objective: SaddleObjective,
                   omega: Sequence[str], psi: Sequence[str], *, name: str = "saddle",
                   eval_loss: str = "squared_error", extra_blocks: dict | None = None) -> FederatedProblem:
    """A minimax problem from an objective ``objective(omega, psi, (x, y, w))`` on minibatches of data rows
    (``omega``/``psi``: the flat block vectors; a weighted mean over the batch rows). ``omega``/``psi``:
    parameter-name patterns of the two players (together all of ``model_fn()``'s parameters). ``eval_loss``
    scores ``model(x)`` on test data."""
    blocks = {OMEGA: list(omega), PSI: list(psi), **(extra_blocks or {})}
    problem = FederatedProblem(data=data, model_fn=model_fn, loss=eval_loss, blocks=blocks, name=name)

    def lift(layout):
        io = torch.nonzero(layout.mask(OMEGA)).flatten()
        ip = torch.nonzero(layout.mask(PSI)).flatten()
        return lambda params, x, y, w: objective(params[..., io.to(params.device)], params[..., ip.to(params.device)],
                                                 (x, y, w))

    return with_saddle_objective(problem, lift, name)


# ------------------------------------------------------------------ client-specific functions
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
                raise ValueError(f"data[{i}]: keys {list(d) if isinstance(d, Mapping) else type(d).__name__} but "
                                 f"client 0 has {self.keys}; allowed: the same keys on every client")
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
                raise ValueError(f"{where}: shape {tuple(t.shape)} {t.dtype} but client 0's is {shape} {dt}; allowed: "
                                 f"the same shapes and types on every client")
            if t.is_floating_point() and t.dtype != self.dtype:
                raise ValueError(f"{where}: {t.dtype} but the start points are {self.dtype}; allowed: one float type")
            if t.is_complex() or t.dtype == torch.bool:
                raise ValueError(f"{where}: {t.dtype}; allowed: real float or integer tensors")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"{where}: holds NaN/inf values; allowed: finite values only")
            flat = t.detach().reshape(-1).to(self.dtype)
            if not t.is_floating_point() and not torch.equal(flat.to(t.dtype), t.reshape(-1)):
                raise ValueError(f"{where}: integers beyond what {self.dtype} holds exactly; allowed: smaller "
                                 f"integers or float64 start points")
            parts.append(flat)
        return torch.cat(parts)

    def unpack(self, row: Tensor) -> tuple[Tensor, Any]:
        """``(i, d_i)`` from a row (``i`` a 0-dim long tensor)."""
        out, at = [], 1
        for _, shape, dt in self.specs:
            n = 1
            for s in shape:
                n *= s
            t = row[at:at + n].reshape(shape)
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


def client_saddle_problem(f: SaddleFunction, x0: Tensor, y0: Tensor, data: Sequence[Any] | None = None,
                          num_clients: int | None = None, name: str = "saddle") -> ClientSaddleProblem:
    """``min_x max_y (1/N) sum_i f(i, x, y, data[i])``: each client's own saddle function, in plain torch.

    ``f(i, x, y, d) -> scalar``: ``i`` is the client's index (a 0-dim integer tensor: index per-client tensors with
    it, ``A[i]``), ``x``/``y`` the players (shaped as ``x0``/``y0``, the start points), ``d`` client i's entry of
    ``data`` (a tensor, a tuple or a dict of tensors, the same shapes on every client; None when no ``data`` is
    given, then ``num_clients`` says how many clients there are). The local steps take the full ``d`` (one data
    row per client). ``f`` is written in tensor operations, so that it runs for one client or for all at once
    (no Python ``if``, ``int()`` or list indexing on ``i`` or on tensor values: refused when the problem is
    built).

    Checked on every client: ``f`` gives a finite real scalar with finite gradients at the start point, and the
    data are finite; ``f``'s mean over the clients is concave in y at the start point (the Hessian in y, for up to
    :data:`CONCAVITY_CHECK_MAX` entries of y): the solvers need a concave max part."""
    return _client_problem(f, x0, y0, data, num_clients, name, check_concave=True)


def _client_problem(f, x0, y0, data, num_clients, name, check_concave: bool) -> ClientSaddleProblem:
    if not callable(f):
        raise ValueError(f"f: expected a function f(i, x, y, d), got {type(f).__name__}")
    for key, t in (("x0", x0), ("y0", y0)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.numel() == 0:
            raise ValueError(f"{key}: expected a non-empty float tensor (the start point), got {t!r:.60}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{key}: holds NaN/inf values; allowed: a finite start point")
    if x0.dtype != y0.dtype:
        raise ValueError(f"y0: {y0.dtype} but x0 is {x0.dtype}; allowed: one float type")
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
    problem = ClientSaddleProblem(data=fdata, model_fn=lambda: SaddlePlayers(x0, y0, value), loss=saddle_value,
                                  blocks={OMEGA: ["x"], PSI: ["y"]}, name=name)
    why = rowwise_mismatch(lambda r: values(value, x0, y0, r.unsqueeze(0)), rows)
    if why is not None:
        raise ValueError(f"f: {why}; allowed: tensor operations on i, x, y and d (index tensors with i, A[i]; no "
                         f"Python if, int() or list indexing on i or on tensor values)")
    if check_concave:
        _check_concave(value, x0, y0, rows)

    def objective(layout):
        return TensorLoss(layout, lambda p, r, _, w: (w * values(value, p["x"], p["y"], r).reshape(-1)).sum())

    return with_saddle_objective(problem, objective, name)


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
                got = f"shape {tuple(v.shape)} {v.dtype}" if isinstance(v, Tensor) else type(v).__name__
                raise ValueError(f"f: client {i} returned {got}; allowed: a real scalar tensor")
            if not bool(torch.isfinite(v).all()):
                raise ValueError(f"f: client {i}'s value at the start point is {float(v)}; allowed: finite values")
            gx, gy = torch.autograd.grad(v.reshape(()), (x, y), allow_unused=True)
        for key, g in (("x", gx), ("y", gy)):
            if g is not None and not bool(torch.isfinite(g).all()):
                raise ValueError(f"f: client {i}'s gradient in {key} at the start point holds NaN/inf; allowed: a "
                                 f"function differentiable there")


def _check_concave(value, x0: Tensor, y0: Tensor, rows: Tensor) -> None:
    """The clients' mean ``f`` is concave in y at the start point: the largest eigenvalue of its Hessian in y is
    at most a round-off tolerance (skipped for a max player of more than :data:`CONCAVITY_CHECK_MAX` entries)."""
    if y0.numel() > CONCAVITY_CHECK_MAX:
        return
    shape = y0.shape

    def mean_f(yv: Tensor) -> Tensor:
        return torch.stack([value(x0, yv.reshape(shape), r).reshape(()) for r in rows.unbind(0)]).mean()

    h = torch.autograd.functional.hessian(mean_f, y0.detach().reshape(-1).clone())
    h = 0.5 * (h + h.T)
    top = float(torch.linalg.eigvalsh(h.double()).max())
    tol = (1e-6 if x0.dtype == torch.float32 else 1e-10) * max(1.0, float(h.abs().max()))
    if top > tol:
        raise ValueError(f"f: the max part is not concave: at the start point the Hessian in y of the clients' mean f "
                         f"has the eigenvalue {top:.3g} > 0 (f grows without bound along it, whatever the step "
                         f"size); allowed: f concave in y (strongly concave for a unique saddle point)")


# ------------------------------------------------------------------ the quadratic case
def quadratic_saddle_problem(A, B, C, a=None, c=None, x0: Tensor | None = None, y0: Tensor | None = None,
                             name: str = "quadratic_saddle") -> ClientSaddleProblem:
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
            raise ValueError(f"{key}: shape {tuple(t.shape[1:])} {t.dtype} on {t.shape[0]} clients; allowed: "
                             f"{want[key][1:]} {A.dtype} on each of the {n} clients (A is {dx}x{dx}, C {dy}x{dy})")
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t.reshape(t.shape[0], -1))).any(-1).nonzero()[0])
            raise ValueError(f"{key}: client {bad}'s entries hold NaN/inf; allowed: finite values only")
    for key, t, part in (("A", A, "min part is not strongly convex in x"),
                         ("C", C, "max part is not strongly concave in y")):
        asym = (t - t.transpose(-1, -2)).abs().amax((-1, -2))
        if bool((asym > 1e-12 * max(1.0, float(t.abs().max()))).any()):
            raise ValueError(f"{key}: client {int(asym.argmax())}'s matrix is not symmetric (max |{key} - {key}'| = "
                             f"{float(asym.max()):.3g}); allowed: symmetric matrices")
        low = float(torch.linalg.eigvalsh(t.mean(0).double()).min())
        if low <= 0:
            raise ValueError(f"{key}: the clients' mean {key} has the eigenvalue {low:.3g} <= 0: the {part}, so "
                             f"no unique saddle point exists (the iterates run off along it, whatever the step "
                             f"size); allowed: mean {key} positive definite")
    x0 = torch.zeros(dx, dtype=A.dtype) if x0 is None else x0
    y0 = torch.zeros(dy, dtype=A.dtype) if y0 is None else y0
    data = [{"A": A[i], "B": B[i], "C": C[i], "a": a[i], "c": c[i]} for i in range(n)]
    return _client_problem(quadratic_value, x0, y0, data, None, name, check_concave=False)


def quadratic_value(i: Tensor, x: Tensor, y: Tensor, d: dict[str, Tensor]) -> Tensor:
    """``1/2 x'Ax + x'By - 1/2 y'Cy + a'x - c'y`` with client i's matrices ``d``."""
    return (0.5 * x @ d["A"] @ x + x @ d["B"] @ y - 0.5 * y @ d["C"] @ y + d["a"] @ x - d["c"] @ y)


def _stack(key: str, v) -> Tensor:
    """One tensor ``[N, ...]`` from a list of per-client tensors (or such a tensor)."""
    if isinstance(v, Tensor):
        t = v
    elif isinstance(v, Sequence) and len(v) and all(isinstance(m, Tensor) for m in v):
        shapes = {tuple(m.shape) for m in v}
        if len(shapes) != 1:
            first = tuple(v[0].shape)
            bad = next(i for i, m in enumerate(v) if tuple(m.shape) != first)
            raise ValueError(f"{key}: client {bad}'s is {tuple(v[bad].shape)} but client 0's is {first}; allowed: "
                             f"the same shape on every client")
        t = torch.stack(list(v))
    else:
        raise ValueError(f"{key}: expected a list of per-client tensors or one tensor [N, ...], got {type(v).__name__}")
    if not t.is_floating_point() or t.dim() < 2:
        raise ValueError(f"{key}: expected float tensors, one per client, got {t.dtype} of shape {tuple(t.shape)}")
    return t
