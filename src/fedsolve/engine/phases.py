"""Phase tables: a protocol with several message types or nested loops, declared as data.

A solver such as Prox-AL FL (an outer loop around an inexact ADMM) or FedNest (several communication rounds per
outer iteration, each with its own message) runs different rounds in different *phases*. It declares them once::

    PHASES = PhaseTable(
        Phase("outer", sends=("w_outer",), uploads=("ut", "dmu"), then=("inner", "done")),
        Phase("inner", sends=("w", "eps"), uploads=("ut", "et", "res"), then=("inner", "outer", "done")),
        Phase("done", then=()),
        start="outer", done="done")

and then (instead of an integer and checks on which keys a message holds):

* ``PHASES.current(server)`` is the name of the phase the next round runs (kept in ``server["phase"]``);
* ``PHASES.enter(server, "inner")`` returns the server state moved to another phase (a transition the table does
  not declare raises, naming both phases);
* ``PHASES.message("inner", w=..., eps=...)`` is the broadcast of that phase: the tensors, tagged with the
  phase's marker key so that a client reads the phase with ``PHASES.of(msg)`` statically (under ``vmap`` and on
  a Flower node alike), and checked against the phase's declared ``sends``;
* ``PHASES.finished(server)``: the run has reached the ``done`` phase (the engine's loop stops there);
* ``Phase.keeps_sample``: a phase whose rounds keep the client sample drawn when the phase was entered
  (FedNest's inner rounds): the engine draws the clients of such a round at ``server["phase_round"]``.

The table is the protocol's documentation too: ``fedsolve list`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

Record = dict[str, Tensor]

#: the prefix of a phase's marker key in a message
MARK = "@"


@dataclass(frozen=True)
class Phase:
    """One phase: its name, the keys its broadcast ``sends`` (besides the marker) and its clients ``uploads``, the
    phases it may move to (``then``), and whether its rounds keep the client sample of the phase's first round."""

    name: str
    sends: tuple[str, ...] = ()
    uploads: tuple[str, ...] = ()
    then: tuple[str, ...] = ()
    keeps_sample: bool = False
    doc: str = ""


@dataclass(frozen=True)
class PhaseTable:
    phases: tuple[Phase, ...]
    start: str
    done: str | None = None
    names: tuple[str, ...] = field(init=False)

    def __init__(self, *phases: Phase, start: str, done: str | None = None):
        object.__setattr__(self, "phases", tuple(phases))
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "done", done)
        object.__setattr__(self, "names", tuple(p.name for p in phases))
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"PhaseTable: phase names must be unique, got {list(self.names)}")
        for name in [start] + ([done] if done else []) + [t for p in phases for t in p.then]:
            if name not in self.names:
                raise ValueError(f"PhaseTable: {name!r} is not a declared phase ({', '.join(self.names)})")

    def __getitem__(self, name: str) -> Phase:
        return self.phases[self.names.index(name)]

    # ------------------------------------------------------------------ server side
    def init(self) -> Record:
        """The server-state entries of the table: the start phase, entered at round 0."""
        return {"phase": torch.tensor(self.names.index(self.start)), "phase_round": torch.tensor(0)}

    def current(self, server: Record) -> str:
        return self.names[int(server["phase"])]

    def enter(self, server: Record, name: str, round_: int | None = None) -> Record:
        """``server`` moved to phase ``name`` (a declared transition of the current phase, or staying in it);
        ``round_``: the round the phase is entered at, for :attr:`Phase.keeps_sample`."""
        now = self.current(server)
        if name != now and name not in self[now].then:
            raise ValueError(
                f"phase table: no transition from {now!r} to {name!r} (declared: {', '.join(self[now].then) or 'none'})"
            )
        out = dict(server)
        out["phase"] = torch.tensor(self.names.index(name))
        if round_ is not None and name != now:
            out["phase_round"] = torch.tensor(int(round_))
        return out

    def finished(self, server: Record) -> bool:
        return self.done is not None and "phase" in server and self.current(server) == self.done

    def sampling_round(self, server: Record, round_: int) -> int:
        """The round whose client draw round ``round_`` takes: ``phase_round`` in a phase that keeps its sample."""
        if "phase" in server and self[self.current(server)].keeps_sample:
            return int(server["phase_round"])
        return round_

    # ------------------------------------------------------------------ messages
    def message(self, name: str, ids: Tensor | None = None, **tensors: Tensor) -> Record:
        """The broadcast of phase ``name``: ``tensors`` (rows of the selected clients) and the phase's marker (an
        empty ``[k, 0]`` tensor, ``k`` from ``ids`` or the first tensor)."""
        want = set(self[name].sends)
        if set(tensors) != want:
            raise ValueError(f"phase {name!r} sends {sorted(want)}, got {sorted(tensors)}")
        k = ids.numel() if ids is not None else next(iter(tensors.values())).shape[0]
        return {**tensors, MARK + name: torch.zeros(k, 0)}

    def of(self, msg: Record) -> str:
        """The phase of a message (or of one client's slice of it): read from its marker key, statically."""
        marks = [k[len(MARK) :] for k in msg if k.startswith(MARK)]
        if len(marks) != 1:
            raise ValueError(f"a phase message carries one marker, got {marks}")
        return marks[0]

    def describe(self) -> str:
        """The table as text (``fedsolve list``)."""
        rows = []
        for p in self.phases:
            mark = " (start)" if p.name == self.start else " (done)" if p.name == self.done else ""
            rows.append(
                f"  {p.name}{mark}: sends {', '.join(p.sends) or '-'}; uploads {', '.join(p.uploads) or '-'}"
                f"; then {', '.join(p.then) or '-'}{'; keeps its sample' if p.keeps_sample else ''}"
                + (f"  ({p.doc})" if p.doc else "")
            )
        return "\n".join(rows)
