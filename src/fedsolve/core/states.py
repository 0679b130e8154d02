"""ClientStates: per-client state indexed by client id, stored only for the clients that have taken part.

Every piece of per-client state (local model copies, duals, personal blocks, control variates, step-size
tolerances) is one named *column* of rows ``[num_clients, ...]``. Nothing is kept on a reused worker object,
so a client's dual can never leak into another client's update (the FL-bench FedADMM pitfall in
specs/prior-art.md).

Memory follows the clients actually touched: a column whose rows all start equal (``torch.zeros(m, d)``,
``repeat_rows(x0, m)``, or a ``defaults`` row) keeps that one *default row* and a slot per client; a client
gets its own stored row the first time :meth:`ClientStates.scatter` writes it, and reads before that return
the default. A round's gather / scatter costs O(selected clients x row size), whatever ``num_clients`` is.
Over a memory budget (``budget_bytes``) the stored rows of a growing column move to a memory-mapped file
(``spill_dir``, a temporary folder by default), so the states of many clients need not fit in memory.
Reads return the same numbers in every layout: the layout is a storage detail.

A *read-only* column (``readonly=`` / :meth:`ClientStates.set_readonly`: constant per-client data such as a
factored Hessian, written once and then only read) is not copied by :meth:`ClientStates.gather` when the
selected clients' rows sit in order in its store (every client, in id order, in the common case): the
gather returns a view of the stored rows, so a round does not copy them. ``local_update`` must not
modify such rows in place (it may still return new ones, which :meth:`ClientStates.scatter` writes).
"""

from __future__ import annotations

import mmap
import os
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

_COPY_BYTES = 64 * 2**20  # rows copied into a spill file per piece (its pages are released after each)


def _close_unlink(fd: int, path: str) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
    try:
        os.unlink(path)
    except OSError:
        pass


class _Spill:
    """The memory-mapped file of one column's stored rows. It grows in place (no copy), and :meth:`release`
    drops its pages from the process (written pages stay in the kernel's page cache until written back), so
    the rows in the file do not count as this process's resident memory. The file goes with its last user."""

    def __init__(self, folder: str):
        fd, self.path = tempfile.mkstemp(dir=folder, suffix=".rows")
        self.fd = fd
        self.map: mmap.mmap | None = None
        self._finalizer = weakref.finalize(self, _close_unlink, fd, self.path)

    def rows(self, capacity: int, row: Tensor) -> Tensor:
        """``[capacity, *row.shape]`` rows of ``row``'s dtype backed by the file (grown to fit; rows already
        written keep their values)."""
        if row.numel() == 0:
            return row.new_empty((capacity, *row.shape))
        nbytes = capacity * row.numel() * row.element_size()
        if os.fstat(self.fd).st_size < nbytes:
            os.ftruncate(self.fd, nbytes)
        self.map = mmap.mmap(self.fd, nbytes)
        return torch.frombuffer(self.map, dtype=row.dtype, count=capacity * row.numel()).view(capacity, *row.shape)

    def head(self, n: int, row: Tensor) -> Tensor:
        """The first ``n`` rows as a tensor whose storage is those rows only (what a checkpoint writes)."""
        return torch.frombuffer(self.map, dtype=row.dtype, count=n * row.numel()).view(n, *row.shape)

    def release(self) -> None:
        if self.map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self.map.madvise(mmap.MADV_DONTNEED)


class _Column:
    """One named state: a default row, the stored rows of the touched clients and each client's slot."""

    __slots__ = ("default", "slot", "rows", "n", "identity", "spill", "readonly", "lookup")

    def __init__(self, default: Tensor, m: int):
        self.default = default  # [*shape]: untouched clients' row
        self.slot = torch.full((m,), -1, dtype=torch.long, device="cpu")  # client -> stored row (-1: untouched)
        self.rows = default.new_empty((0, *default.shape))  # [capacity, *shape]
        self.n = 0  # rows in use
        self.identity = False  # a dense column: row i is client i's for every client (no slot lookup needed)
        self.spill: _Spill | None = None  # the memory-mapped file, once spilled
        self.readonly = False  # gathered as a view of the store where possible (module docstring)
        #: the slots of the last ids looked up (:meth:`ClientStates._lookup`), dropped when a slot changes
        self.lookup: _Lookup | None = None

    @property
    def path(self) -> str | None:
        return None if self.spill is None else self.spill.path

    def release(self) -> None:
        """Drop the spill file's pages from this process (after a read or write of its rows)."""
        if self.spill is not None:
            self.spill.release()

    @classmethod
    def dense(cls, value: Tensor) -> _Column:
        col = cls(value[0].clone() if value.shape[0] else value.new_zeros(value.shape[1:]), value.shape[0])
        col.slot = torch.arange(value.shape[0], device="cpu")
        col.rows, col.n, col.identity = value, value.shape[0], True
        return col

    @property
    def device(self) -> torch.device:
        return self.default.device

    def row_bytes(self) -> int:
        return self.default.numel() * self.default.element_size()

    def memory_bytes(self) -> int:
        """Bytes held in memory (the stored rows unless spilled, the default row and the slots)."""
        rows = 0 if self.path is not None else self.rows.shape[0] * self.row_bytes()
        return rows + self.row_bytes() + self.slot.numel() * 8

    def disk_bytes(self) -> int:
        return self.rows.shape[0] * self.row_bytes() if self.path is not None else 0


@dataclass(frozen=True, eq=False)
class _Lookup:
    """Where the rows of the clients of one ids tensor lie in a column's store (:meth:`ClientStates._lookup`):
    ``gen`` names the ids (:meth:`ClientStates._ids_gen`), ``slots`` are their slots, ``known`` says whether
    every one has a stored row, and ``run`` is the first slot when they are consecutive slots in order (worked
    out for a read-only column only; else None: a view of the store cannot hold them)."""

    gen: int
    slots: Tensor
    known: bool
    run: int | None
    #: ``slots`` on the device of the column's stored rows (the index of ``index_select``)
    at_rows: Tensor


def _run_start(s: Tensor) -> int | None:
    """``s[0]`` when ``s`` (a 1-D CPU index tensor) is ``s[0], s[0] + 1, ...`` with ``s[0] >= 0``, else None."""
    first = int(s[0])
    return first if first >= 0 and torch.equal(s, torch.arange(first, first + s.numel(), device=s.device)) else None


class ClientStates:
    """Named per-client states with row gather / scatter by client ids (module docstring).

    Args:
        num_clients: m, the number of clients.
        tensors: ``{name: [m, ...]}`` initial rows (stored as one default row when all rows are equal).
        defaults: ``{name: [...]}`` the initial row of every client, without an ``[m, ...]`` tensor.
        budget_bytes: in-memory bytes of stored rows above which a growing column moves to a memory-mapped file
            (None: never).
        spill_dir: the folder of those files (default: a new temporary folder).
        readonly: names of read-only columns (gathered without a copy where possible; module docstring).
    """

    def __init__(
        self,
        num_clients: int,
        tensors: Mapping[str, Tensor] | None = None,
        *,
        defaults: Mapping[str, Tensor] | None = None,
        budget_bytes: int | None = None,
        spill_dir: str | os.PathLike | None = None,
        readonly: Iterable[str] = (),
    ):
        self.num_clients = int(num_clients)
        self._cols: dict[str, _Column] = {}
        self.budget_bytes = budget_bytes
        self.spill_dir = None if spill_dir is None else str(spill_dir)
        self._ids: Tensor | None = None  # the ids of the last gather or scatter (a copy) and their number
        self._gen = 0
        #: how the last gather read each column (:meth:`gather`): ``(gen, [(name, column, its rows, their number,
        #: its lookup, the view returned or None for an index_select)])``, reused while all of them are unchanged
        self._plan: tuple[int, list[tuple[str, _Column, Tensor, int, _Lookup | None, Tensor | None]]] | None = None
        for k, v in (tensors or {}).items():
            self[k] = v
        for k, row in (defaults or {}).items():
            self.set_default(k, row)
        self.set_readonly(readonly)

    # ---------------------------------------------------------------- configuration
    def set_default(self, key: str, row: Tensor) -> None:
        """Column ``key`` with every client's row equal to ``row`` (nothing stored per client yet; a read-only
        column stays read-only)."""
        self._put(key, _Column(row.detach().clone(), self.num_clients))

    def _put(self, key: str, col: _Column) -> None:
        old = self._cols.get(key)
        col.readonly = old is not None and old.readonly
        self._cols[key] = col

    def set_readonly(self, keys: Iterable[str]) -> None:
        """Mark columns ``keys`` read-only (gathered as views of their stored rows where possible)."""
        for k in keys:
            if k not in self._cols:
                raise KeyError(f"readonly: unknown client state {k!r}; known: {sorted(self._cols)}")
            self._cols[k].readonly = True
            self._cols[k].lookup = None  # looked up again, as a read-only column

    def readonly(self) -> tuple[str, ...]:
        """Names of the read-only columns."""
        return tuple(k for k, col in self._cols.items() if col.readonly)

    def set_budget(self, budget_bytes: int | None, spill_dir: str | os.PathLike | None = None) -> None:
        """The memory budget for stored rows (None: unlimited) and the folder of the spill files; columns
        already over it move to their file now."""
        self.budget_bytes = budget_bytes
        if spill_dir is not None:
            self.spill_dir = str(spill_dir)
        if budget_bytes is not None:
            for col in self._cols.values():
                if col.spill is None and col.rows.shape[0] and self.memory_bytes() > budget_bytes:
                    self._resize(col, col.rows.shape[0], spill=True)

    # ---------------------------------------------------------------- dict-like
    def __setitem__(self, key: str, value: Tensor) -> None:
        if value.shape[:1] != (self.num_clients,):
            raise ValueError(f"client state {key!r} must have leading dim {self.num_clients}, got {tuple(value.shape)}")
        if value.shape[0] and (value.stride(0) == 0 or torch.equal(value, value[:1].expand_as(value))):
            self.set_default(key, value[0])  # every row equal: one row until clients write their own
        else:
            self._put(key, _Column.dense(value))

    def __getitem__(self, key: str) -> Tensor:
        """All m rows of ``key`` ``[m, ...]``: the live tensor of a dense column, else a materialized copy
        (O(m); the engine itself reads rows with :meth:`gather`)."""
        col = self._cols[key]
        if col.identity:
            return col.rows
        full = col.default.unsqueeze(0).repeat(self.num_clients, *([1] * col.default.dim()))
        touched = torch.nonzero(col.slot >= 0).flatten()
        if touched.numel():
            full[touched.to(col.device)] = col.rows.index_select(0, col.slot[touched].to(col.rows.device)).to(
                col.device
            )
        return full

    def __contains__(self, key: str) -> bool:
        return key in self._cols

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def keys(self):
        return self._cols.keys()

    def items(self):
        return ((k, self[k]) for k in self._cols)

    # ---------------------------------------------------------------- rows
    def gather(self, ids: Tensor) -> dict[str, Tensor]:
        """Rows of the selected clients: ``{name: [k, ...]}`` (copies, except views of a read-only column's
        stored rows when they sit in order, or of its default row when no client has a row of its own; the default
        row for a client not yet written)."""
        ids_c, gen = self._ids_gen(ids.cpu())
        again = self._replay(gen)
        if again is not None:
            return again
        out: dict[str, Tensor] = {}
        plan: list | None = [] if ids_c.numel() else None
        for k, col in self._cols.items():
            out[k] = self._gather(col, ids_c, gen)
            if plan is None:
                continue
            look = col.lookup
            if col.readonly and col.n == 0:  # a view of the default row
                plan.append((k, col, col.rows, col.n, col.lookup, out[k]))
            elif col.spill is None and look is not None and look.gen == gen and look.known:
                view = out[k] if col.readonly and look.run is not None else None  # else an index_select
                plan.append((k, col, col.rows, col.n, look, view))
            else:  # default rows mixed in, or a spill file: worked out afresh every time
                plan = None
        self._plan = None if plan is None else (gen, plan)
        return out

    def _replay(self, gen: int) -> dict[str, Tensor] | None:
        """The last gather's reading again when the ids (``gen``) and every column it read (its object, stored
        rows and lookup) are unchanged: the same views, fresh copies of the rest; else None. (A round of full
        participation gathers the same ids every time: this skips the per-column bookkeeping.)"""
        plan = self._plan
        if plan is None or plan[0] != gen or len(plan[1]) != len(self._cols):
            return None
        cols, out = self._cols, {}
        for k, col, rows, n, look, view in plan[1]:
            if cols.get(k) is not col or col.rows is not rows or col.n != n or col.lookup is not look:
                return None
            out[k] = view if view is not None else rows.index_select(0, look.at_rows)  # type: ignore[union-attr]
        return out

    def _ids_gen(self, ids_c: Tensor) -> tuple[Tensor, int]:
        """``(ids, gen)``: the values of ``ids_c`` (CPU) in a copy this object owns (lookups keep it: the caller may
        change its tensor in place later) and a number that names them, the same as the last call's when the ids
        are equal (a round's gather and scatter, and every round of full participation, look their slots up once)."""
        last = self._ids
        if last is None or last.shape != ids_c.shape or not torch.equal(last, ids_c):
            last = self._ids = ids_c.clone()
            self._gen += 1
        return last, self._gen

    @staticmethod
    def _lookup(col: _Column, ids_c: Tensor, gen: int) -> _Lookup:
        """``col``'s :class:`_Lookup` of the clients ``ids_c`` named ``gen``, kept until the ids or the column's
        slots change."""
        look = col.lookup
        if look is not None and look.gen == gen:
            return look
        s = ids_c if col.identity else col.slot[ids_c]
        known = col.identity or bool((s >= 0).all())
        run = _run_start(s) if col.readonly and known and s.numel() else None
        dev = col.rows.device
        col.lookup = _Lookup(gen, s, known, run, s if dev.type == "cpu" else s.to(dev))
        return col.lookup

    def _gather(self, col: _Column, ids_c: Tensor, gen: int) -> Tensor:
        """One column's rows of the clients ``ids_c`` (CPU) named ``gen``: a view of a read-only column's store
        when they lie there in order, else a copy."""
        if ids_c.numel() == 0:
            return col.default.new_empty((0, *col.default.shape))
        if col.readonly and col.n == 0:  # constant data no client has written: every row the default, one view
            return col.default.expand(ids_c.numel(), *col.default.shape)
        look = self._lookup(col, ids_c, gen)
        if col.spill is None and look.known:  # the rows live where the default row does
            if look.run is not None:
                return col.rows[look.run : look.run + ids_c.numel()]
            return col.rows.index_select(0, look.at_rows)
        dev = col.rows.device
        if look.known:
            out = col.rows.index_select(0, look.at_rows).to(col.device)
        else:
            s = look.slots
            known = s >= 0
            out = col.default.unsqueeze(0).repeat(s.numel(), *([1] * col.default.dim()))
            if bool(known.any()):
                out[known.to(col.device)] = col.rows.index_select(0, s[known].to(dev)).to(col.device)
        col.release()
        return out

    def row(self, i: int) -> dict[str, Tensor]:
        return {k: v[0] for k, v in self.gather(torch.tensor([int(i)], device="cpu")).items()}

    def scatter(self, ids: Tensor, rows: Mapping[str, Tensor]) -> None:
        """Write back rows of the selected clients; other clients stay bit-identical."""
        gen = ids_c = None
        for k, v in rows.items():
            if k not in self._cols:
                raise KeyError(f"local_update returned unknown client state {k!r}; known: {sorted(self._cols)}")
            col = self._cols[k]
            v = (
                v
                if v.device == col.rows.device and v.dtype == col.rows.dtype
                else v.to(col.rows.device, col.rows.dtype)
            )
            if col.identity:
                col.rows.index_copy_(0, ids if ids.device == col.rows.device else ids.to(col.rows.device), v)
                continue
            if gen is None or ids_c is None:  # set together, on the first column that keeps slots
                ids_c, gen = self._ids_gen(ids.cpu())
            look = self._lookup(col, ids_c, gen)
            s = look.slots
            if not look.known:  # first write of some of these clients: a stored row each (amortized growth)
                s = s.clone()
                new = s < 0
                n_new = int(new.sum())
                if col.n + n_new > col.rows.shape[0]:
                    self._resize(col, min(max(col.n + n_new, 2 * col.rows.shape[0], 16), self.num_clients))
                s[new] = torch.arange(col.n, col.n + n_new, device="cpu")
                col.slot[ids_c[new]] = s[new]
                col.n += n_new
                col.lookup = None  # the slots changed
            col.rows.index_copy_(0, look.at_rows if look.known else s.to(col.rows.device), v)
            col.release()

    def _resize(self, col: _Column, capacity: int, spill: bool = False) -> None:
        """Give ``col`` room for ``capacity`` stored rows: in memory, or in a memory-mapped file when the
        budget would be exceeded (or ``spill``); a column already in its file grows there in place."""
        if col.spill is not None:
            col.rows = col.spill.rows(capacity, col.default)
            return
        new_bytes = capacity * col.row_bytes()
        over = (
            self.budget_bytes is not None
            and self.memory_bytes() - col.rows.shape[0] * col.row_bytes() + new_bytes > self.budget_bytes
        )
        if spill or over:
            d = self.spill_dir or tempfile.mkdtemp(prefix="fedsolve-states-")
            self.spill_dir = d
            os.makedirs(d, exist_ok=True)
            sp = _Spill(d)
            rows = sp.rows(capacity, col.default)
            col.spill = sp
            self._copy_rows(col, rows, col.rows, col.n)
            col.rows = rows
        else:
            rows = col.default.new_empty((capacity, *col.default.shape))
            rows[: col.n] = col.rows[: col.n]
            col.rows = rows

    @staticmethod
    def _copy_rows(col: _Column, dst: Tensor, src: Tensor, n: int) -> None:
        """``dst[:n] = src[:n]`` in pieces, releasing ``col``'s spill pages after each piece."""
        step = max(1, _COPY_BYTES // max(col.row_bytes(), 1))
        for a in range(0, n, step):
            b = min(a + step, n)
            dst[a:b].copy_(src[a:b].to(dst.device))
            col.release()

    # ---------------------------------------------------------------- copies and sizes
    def clone(self) -> ClientStates:
        out = ClientStates(self.num_clients, budget_bytes=self.budget_bytes, spill_dir=self.spill_dir)
        for k, col in self._cols.items():
            if col.identity:
                out._cols[k] = _Column.dense(col.rows.clone())
                continue
            c = _Column(col.default.clone(), self.num_clients)
            c.slot = col.slot.clone()
            out._cols[k] = c
            out._resize(c, max(col.n, 1), spill=col.spill is not None)
            self._copy_rows(c, c.rows, col.rows, col.n)
            col.release()
            c.n = col.n
        out.set_readonly(self.readonly())
        return out

    def to(self, device: torch.device | str) -> ClientStates:
        """The same states with every tensor on ``device`` (stored rows in a spill file stay in their file;
        reads return them on ``device``). Storage already there is shared, not copied."""
        out = ClientStates(self.num_clients, budget_bytes=self.budget_bytes, spill_dir=self.spill_dir)
        for k, col in self._cols.items():
            if col.identity:
                out._cols[k] = _Column.dense(col.rows.to(device))
                continue
            c = _Column(col.default.to(device), self.num_clients)
            c.slot, c.n, c.spill = col.slot.clone(), col.n, col.spill
            c.rows = col.rows if col.spill is not None else col.rows.to(device)
            out._cols[k] = c
        out.set_readonly(self.readonly())
        return out

    def touched(self, key: str) -> Tensor:
        """Ids of the clients with a stored row of ``key`` (every client for a dense column)."""
        col = self._cols[key]
        return torch.arange(self.num_clients, device="cpu") if col.identity else torch.nonzero(col.slot >= 0).flatten()

    def state_dict(self) -> dict[str, Tensor]:
        """``{name: [m, ...]}`` (the dense rows: see :meth:`__getitem__`)."""
        return {k: self[k] for k in self._cols}

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Tensor]) -> ClientStates:
        m = next(iter(d.values())).shape[0] if d else 0
        return cls(m, d)

    # ---------------------------------------------------------------- checkpoints
    COMPACT = "fedsolve.ClientStates/1"

    def compact_state_dict(self) -> dict:
        """What a checkpoint stores: per column its default row, the clients' slots and the stored rows only (a
        dense column as is), so saving costs the touched clients' rows, not ``[m, ...]``."""
        cols = {
            k: {"dense": col.rows}
            if col.identity
            else {"default": col.default, "slot": col.slot, "rows": self._stored(col)}
            for k, col in self._cols.items()
        }
        out = {"format": self.COMPACT, "num_clients": self.num_clients, "columns": cols}
        if self.readonly():
            out["readonly"] = list(self.readonly())
        return out

    @staticmethod
    def _stored(col: _Column) -> Tensor:
        """The ``n`` stored rows as a tensor whose storage holds them only (a slice of the ``capacity`` rows
        would write the whole storage): the rows themselves when full, a view of the spill file's head, or
        an in-memory copy."""
        if col.rows.shape[0] == col.n:
            return col.rows
        if col.spill is not None and col.n and col.row_bytes():
            return col.spill.head(col.n, col.default)
        return col.rows[: col.n].clone()

    @classmethod
    def load(
        cls,
        d: Mapping | None,
        num_clients: int,
        *,
        budget_bytes: int | None = None,
        spill_dir: str | os.PathLike | None = None,
    ) -> ClientStates:
        """States from a checkpoint's entry: :meth:`compact_state_dict` (the stored rows come back as stored
        rows, into spill files when over ``budget_bytes``) or (older checkpoints) :meth:`state_dict`."""
        if not d:
            return cls(num_clients, budget_bytes=budget_bytes, spill_dir=spill_dir)
        if d.get("format") != cls.COMPACT:
            out = cls.from_state_dict(d)
            out.set_budget(budget_bytes, spill_dir)
            return out
        out = cls(int(d["num_clients"]), budget_bytes=budget_bytes, spill_dir=spill_dir)
        for k, c in d["columns"].items():
            if "dense" in c:
                out._cols[k] = _Column.dense(c["dense"])
                continue
            col = _Column(c["default"].clone(), out.num_clients)
            col.slot = c["slot"].to("cpu", torch.long).clone()
            n = int(c["rows"].shape[0])
            out._cols[k] = col
            out._resize(col, max(n, 1))
            out._copy_rows(col, col.rows, c["rows"], n)
            col.n = n
        out.set_readonly(d.get("readonly", ()))
        return out

    @classmethod
    def shapes(cls, d: Mapping | ClientStates | None) -> dict[str, Tensor]:
        """``{name: [m, ...]}`` tensors on the ``meta`` device (shape and dtype, no memory) of states or of a
        checkpoint's entry (either format): what a resume check compares."""
        if isinstance(d, ClientStates):
            return {
                k: torch.empty((d.num_clients, *c.default.shape), dtype=c.default.dtype, device="meta")
                for k, c in d._cols.items()
            }
        if not isinstance(d, Mapping) or not d:
            return {}
        if d.get("format") != cls.COMPACT:
            return {
                k: torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, Tensor) else v
                for k, v in d.items()
            }
        m = int(d["num_clients"])
        return {
            k: torch.empty(c["dense"].shape, dtype=c["dense"].dtype, device="meta")
            if "dense" in c
            else torch.empty((m, *c["default"].shape), dtype=c["default"].dtype, device="meta")
            for k, c in d["columns"].items()
        }

    def memory_bytes(self) -> int:
        """Bytes of client state held in memory."""
        return sum(col.memory_bytes() for col in self._cols.values())

    def disk_bytes(self) -> int:
        """Bytes of stored rows in memory-mapped spill files."""
        return sum(col.disk_bytes() for col in self._cols.values())

    def nbytes(self) -> int:
        """Bytes of client state, in memory and in spill files."""
        return self.memory_bytes() + self.disk_bytes()

    def __repr__(self) -> str:  # pragma: no cover
        cols = ", ".join(
            f"{k}{(self.num_clients, *col.default.shape)}[{'dense' if col.identity else col.n}]"
            for k, col in self._cols.items()
        )
        return f"ClientStates({cols})"


def repeat_rows(vec: Tensor, m: int) -> Tensor:
    """``[d] -> [m, d]`` (a real copy, each client owns its row)."""
    return vec.unsqueeze(0).repeat(m, *([1] * vec.dim()))
