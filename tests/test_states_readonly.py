"""ClientStates read-only columns: gathered as views of the store (no per-round copy), same numbers as copies."""

from __future__ import annotations

import pytest
import torch

from fedsolve.core.states import ClientStates


def _states(m=5):
    s = ClientStates(m, {"x": torch.arange(m * 3, dtype=torch.float64).view(m, 3)},
                     defaults={"K": torch.zeros(4, 4), "v": torch.zeros(2)}, readonly=("x", "K"))
    s.scatter(torch.arange(m), {"K": torch.randn(m, 4, 4), "v": torch.randn(m, 2)})
    return s


def test_readonly_gather_is_a_view_in_order_and_a_copy_otherwise():
    s = _states()
    ids = torch.arange(5)
    rows = s.gather(ids)
    for k in ("x", "K"):   # dense column and stored rows: views of the store
        assert rows[k].untyped_storage().data_ptr() == s._cols[k].rows.untyped_storage().data_ptr(), k
        assert torch.equal(rows[k], s[k])
    assert rows["v"].untyped_storage().data_ptr() != s._cols["v"].rows.untyped_storage().data_ptr()  # not read-only
    sub = s.gather(torch.tensor([1, 2, 3]))          # consecutive: still a view
    assert sub["K"].untyped_storage().data_ptr() == s._cols["K"].rows.untyped_storage().data_ptr()
    perm = torch.tensor([3, 0, 2])                   # out of order: a copy, the same numbers
    got = s.gather(perm)
    assert got["K"].untyped_storage().data_ptr() != s._cols["K"].rows.untyped_storage().data_ptr()
    assert torch.equal(got["K"], s["K"][perm]) and torch.equal(got["x"], s["x"][perm])


def test_readonly_survives_writes_copies_and_checkpoints():
    s = _states()
    new = torch.randn(2, 4, 4)
    s.scatter(torch.tensor([1, 3]), {"K": new})       # still writable through scatter
    assert torch.equal(s["K"][torch.tensor([1, 3])], new)
    s.set_default("x", torch.ones(3))                 # replacing a column keeps the flag
    assert set(s.readonly()) == {"x", "K"}
    for other in (s.clone(), s.to("cpu"), ClientStates.load(s.compact_state_dict(), 5)):
        assert set(other.readonly()) == {"x", "K"}
        assert all(torch.equal(other[k], s[k]) for k in s.keys())
    with pytest.raises(KeyError, match="nope"):
        s.set_readonly(["nope"])


def test_unwritten_clients_read_the_default_row():
    s = ClientStates(4, defaults={"K": torch.full((2,), 7.0)}, readonly=("K",))
    s.scatter(torch.tensor([0, 1]), {"K": torch.zeros(2, 2)})
    got = s.gather(torch.arange(4))                   # clients 2, 3 not stored yet: a copy with the default
    assert torch.equal(got["K"], torch.tensor([[0.0, 0.0], [0.0, 0.0], [7.0, 7.0], [7.0, 7.0]]))


def test_slot_lookups_follow_new_ids_new_rows_and_ids_changed_in_place():
    """A round's slots are looked up once and kept for the same ids (gather, scatter, the next full round): a
    first write of a client, other ids (even the same tensor changed in place) and a new read-only flag are seen."""
    s = ClientStates(4, defaults={"v": torch.zeros(2), "K": torch.zeros(2)})
    ids = torch.tensor([0, 2])
    assert torch.equal(s.gather(ids)["v"], torch.zeros(2, 2))
    s.scatter(ids, {"v": torch.tensor([[1.0, 1.0], [2.0, 2.0]]), "K": torch.ones(2, 2)})   # first writes: new slots
    assert torch.equal(s.gather(ids)["v"], torch.tensor([[1.0, 1.0], [2.0, 2.0]]))
    ids[1] = 3                                                           # the same tensor, other clients
    assert torch.equal(s.gather(ids)["v"], torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    s.scatter(ids, {"v": torch.tensor([[5.0, 5.0], [6.0, 6.0]])})
    assert torch.equal(s["v"], torch.tensor([[5.0, 5.0], [0.0, 0.0], [2.0, 2.0], [6.0, 6.0]]))
    s.scatter(torch.tensor([1, 3]), {"K": torch.full((2, 2), 3.0)})
    s.set_readonly(["K"])                                                # slots 0..3 hold clients 0, 2, 1, 3
    pair = torch.tensor([0, 2])
    got = s.gather(pair)
    assert got["K"].untyped_storage().data_ptr() == s._cols["K"].rows.untyped_storage().data_ptr()
    assert torch.equal(got["K"], torch.ones(2, 2)) and torch.equal(s.gather(torch.tensor([1, 3]))["K"],
                                                                   torch.full((2, 2), 3.0))


def test_gathers_that_replay_the_last_reading_match_a_plain_model_through_random_operations():
    """``gather`` replays its last reading (same views, fresh copies) while the ids and every column are unchanged;
    through 400 random operations (gathers and scatters of random, repeated, full or in-place-changed ids, first
    writes, column replacements, a new read-only flag, a memory budget that spills, a caller that changes the ids
    tensor it gave and passes the old values in a new one) every gather equals the rows of
    a plain dict of full tensors, no copy shares storage with the store, and a write through a gathered copy never
    reaches the store."""
    g = torch.Generator().manual_seed(0)
    m = 6
    model = {"x": torch.randn(m, 3, generator=g, dtype=torch.float64), "K": torch.zeros(m, 2, 2), "v": torch.zeros(m, 2)}
    s = ClientStates(m, {"x": model["x"].clone()}, defaults={"K": torch.zeros(2, 2), "v": torch.zeros(2)},
                     readonly=("x", "K"))
    ids = torch.arange(m)
    replays = 0
    for step in range(400):
        op = int(torch.randint(0, 10, (1,), generator=g))
        if op < 2:                                                    # other ids: full, a run, or a random subset
            kind = int(torch.randint(0, 3, (1,), generator=g))
            ids = (torch.arange(m) if kind == 0 else torch.arange(1, 4) if kind == 1 else
                   torch.randperm(m, generator=g)[: int(torch.randint(1, m + 1, (1,), generator=g))])
        elif op == 2 and ids.numel() > 1:                             # the same tensor changed in place
            ids[0], ids[-1] = int(ids[-1]), int(ids[0])
        elif op in (3, 4, 5):                                         # writes (first writes included)
            key = ("x", "K", "v")[int(torch.randint(0, 3, (1,), generator=g))]
            new = torch.randn(ids.numel(), *model[key].shape[1:], generator=g, dtype=model[key].dtype)
            s.scatter(ids, {key: new})
            model[key][ids] = new
        elif op == 6 and step % 50 == 6:                              # a column replaced by a new default
            s.set_default("v", torch.full((2,), float(step)))
            model["v"][:] = float(step)
        elif op == 7 and step == 207:
            s.set_readonly(["v"])
        elif op == 8 and step > 300 and s.budget_bytes is None:      # the rows move to spill files
            s.set_budget(0)
        elif op == 9 and ids.numel() > 1:     # the caller changes the tensor it gave; passes its old values anew
            fresh = ids.clone()
            ids.copy_(ids.flip(0))
            ids = fresh
        before = s._plan
        got = s.gather(ids)
        replays += before is not None and s._plan is before
        for k, want in model.items():
            assert torch.equal(got[k], want[ids]), (step, k)
            store = s._cols[k].rows
            if not s._cols[k].readonly and got[k].numel() and store.numel():
                assert got[k].untyped_storage().data_ptr() != store.untyped_storage().data_ptr(), (step, k)
        if not s._cols["v"].readonly:
            got["v"].add_(1.0)                                        # a copy: the store keeps its numbers
            assert torch.equal(s.gather(ids)["v"], model["v"][ids]), step
    assert replays > 50, replays
