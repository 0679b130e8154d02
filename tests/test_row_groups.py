"""Row groups (phases that draw from one named split of each client's data) and problem kinds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsolve.core.executor import Work, build_plans
from fedsolve.core.rng import RngStreams
from fedsolve.data.federated import FederatedData
from fedsolve.families import get_problem_kind
from fedsolve.problems import PROBLEM_KINDS, register_problem_kind


def grouped_data(m: int = 4, seed: int = 0) -> FederatedData:
    rng = np.random.default_rng(seed)
    tr, te, groups = [], [], []
    for i in range(m):
        n = 6 + 3 * i
        x = rng.normal(size=(n, 3)).astype(np.float32)
        tr.append((x, rng.integers(0, 2, n)))
        te.append((x[:2], rng.integers(0, 2, 2)))
        g = np.zeros(n, dtype=np.int64)
        g[rng.permutation(n)[: n // 3]] = 1          # a third of each client's rows are "upper"
        groups.append(g)
    data = FederatedData.from_client_arrays(tr, te, num_classes=2)
    data.train_groups = torch.as_tensor(np.concatenate(groups))
    data.group_names = ("lower", "upper")
    data.__post_init__()
    return data


@pytest.mark.parametrize("batch_size", [None, 2])
def test_group_phase_draws_only_its_rows(batch_size):
    data = grouped_data()
    ids = torch.arange(data.num_clients)
    work = {"up": Work(epochs=2, batch_size=batch_size, group="upper"), "all": Work(epochs=1, batch_size=batch_size)}
    plans = build_plans(work, data.train_offsets, ids, RngStreams(0), 3, groups=data.row_groups)
    up = plans["up"]
    for k, cid in enumerate(ids.tolist()):
        g = data.client_train_groups(cid)
        n_up = int((g == 1).sum())
        a = int(data.train_offsets[cid])
        rows = up.idx[k][up.w[k] > 0] - a
        assert torch.all(g[rows] == 1)
        # two epochs over the group: every upper row used exactly twice (weight 1/len(batch) each)
        counts = torch.bincount(rows, minlength=g.numel())
        assert torch.equal(counts[g == 1], torch.full((n_up,), 2 if batch_size else int(up.active[k].sum())))
        assert int(counts[g == 0].sum()) == 0
    # the ungrouped phase still covers every row of the client
    allp = plans["all"]
    k = 1
    rows = allp.idx[k][allp.w[k] > 0] - int(data.train_offsets[1])
    assert sorted(set(rows.tolist())) == list(range(int(data.train_sizes[1])))


def test_group_errors_name_the_group():
    data = grouped_data()
    ids = torch.arange(2)
    with pytest.raises(ValueError, match="unknown row group 'middle'.*allowed: \\['lower', 'upper'\\]"):
        build_plans({"p": Work(group="middle")}, data.train_offsets, ids, RngStreams(0), 0, groups=data.row_groups)
    with pytest.raises(ValueError, match="no train_groups"):
        build_plans({"p": Work(group="upper")}, data.train_offsets, ids, RngStreams(0), 0)
    with pytest.raises(ValueError, match="one group id per training row"):
        FederatedData(data.train_x, data.train_y, data.train_offsets, data.test_x, data.test_y, data.test_offsets,
                      num_classes=2, train_groups=torch.zeros(3, dtype=torch.long), group_names=("a",))


def test_subset_and_validation_split_keep_groups():
    data = grouped_data()
    sub = data.subset([2, 0])
    assert torch.equal(sub.client_train_groups(0), data.client_train_groups(2))
    assert torch.equal(sub.client_train_groups(1), data.client_train_groups(0))
    assert sub.group_names == data.group_names
    val = data.split_validation(0.25, seed=1)
    assert val.train_groups.numel() == val.train_x.shape[0] and val.group_names == data.group_names
    # a node's own plan (rows 0:n, its own groups) equals the simulator's plan for that client, shifted
    cid = 2
    full = build_plans({"up": Work(epochs=1, batch_size=2, group="upper")}, data.train_offsets,
                       torch.tensor([cid]), RngStreams(0), 5, groups=data.row_groups)["up"]
    n = int(data.train_sizes[cid])
    off = torch.zeros(data.num_clients + 1, dtype=torch.long)
    off[cid + 1:] = n
    own = build_plans({"up": Work(epochs=1, batch_size=2, group="upper")}, off, torch.tensor([cid]), RngStreams(0),
                      5, groups=(data.client_train_groups(cid), data.group_names))["up"]
    assert torch.equal(full.idx - int(data.train_offsets[cid]), own.idx) and torch.equal(full.w, own.w)


def test_problem_kind_registry_and_config():
    from fedsolve.experiments.config import parse_config
    from fedsolve.experiments.runner import build_problem

    @register_problem_kind("_test_tagged")
    def tagged(problem, params, seed):
        if set(params) - {"tag"}:
            raise ValueError(f"unknown parameter(s) {sorted(set(params) - {'tag'})}; allowed: ['tag']")
        problem.extras["tag"] = (params.get("tag"), seed)
        return problem

    try:
        assert get_problem_kind("_test_tagged") is tagged
        raw = {"data": {"dataset": "digits", "num_clients": 3}, "algorithm": {"name": "fedavg"},
               "problem": {"kind": "_test_tagged", "params": {"tag": "x"}}}
        cfg = parse_config(raw)
        assert build_problem(cfg, seed=4).extras["tag"] == ("x", 4)
        with pytest.raises(ValueError, match="problem.params: unknown parameter"):
            build_problem(parse_config({**raw, "problem": {"kind": "_test_tagged", "params": {"tga": 1}}}), seed=0)
        with pytest.raises(ValueError, match="problem.kind: unknown 'nope'"):
            parse_config({**raw, "problem": {"kind": "nope"}})
    finally:
        PROBLEM_KINDS.pop("_test_tagged", None)
