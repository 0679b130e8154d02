"""Experiment configs: YAML validated into typed objects.

An unknown key or a bad value is rejected with the field's dotted name and the allowed values
(``ConfigError``). Algorithm hyper-parameters are validated by the algorithm's own typed
config, so every default is the paper's default unless the YAML says otherwise.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedsolve.engine.loop import SimulationConfig
from fedsolve.experiments.errors import ConfigError
from fedsolve.experiments.tuning import is_numeric


class TargetSpec(BaseModel):
    """An object named by import path, with parameters: ``{target: "package.module:name", params: {...}}``."""

    model_config = ConfigDict(extra="forbid")
    target: str = Field(
        ..., description="import path 'package.module:name' (module on the Python path or in the current folder)"
    )
    params: dict[str, Any] = Field(default_factory=dict, description="keyword parameters it is called with")

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        return _importable(v)


def _importable(path: str) -> str:
    """``path`` if it names an importable object (else ValueError saying why)."""
    from fedsolve.data.imports import resolve_target

    resolve_target(path)
    return path


class DataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dataset: str | None = Field(None, description="dataset name (fedsolve list datasets); give this or `target`")
    target: str | None = Field(
        None,
        description="import path 'package.module:function' of a function (or a "
        "Dataset class) that builds the data, called with `params` "
        "(and seed / num_clients when it takes them); it returns a torch "
        "Dataset, a list of Datasets (one per client), {train:, test:}, a "
        "Hugging Face dataset, PooledData or FederatedData. See "
        "docs/datasets.md",
    )
    sample_transform: TargetSpec | None = Field(
        None,
        description="a function applied once to every sample's input when the data is built, as "
        "fn(x, **params) on a float tensor: {target: 'package.module:function', params: {...}} "
        "or just the import path; random draws come from the run's seed, once (not per round)",
    )
    num_clients: int | None = Field(
        20,
        ge=1,
        description="number of clients m (null: the dataset's own, e.g. natural users or a paper's fixed split)",
    )
    partition: str = Field("iid", description="partitioner name (fedsolve list partitioners)")
    partition_params: dict[str, Any] = Field(default_factory=dict, description="partitioner parameters")
    test_fraction: float | None = Field(
        0.25,
        gt=0,
        lt=1,
        description="share of each client's samples held out "
        "for test (null: keep the dataset's own test set, partitioned separately)",
    )
    cluster_transform: Literal["label_swap", "rotation"] | None = Field(
        None, description="clustered transform applied per client (records true clusters)"
    )
    transform_params: dict[str, Any] = Field(default_factory=dict, description="cluster transform parameters")
    params: dict[str, Any] = Field(default_factory=dict, description="dataset parameters")
    dtype: Literal["float32", "float64"] = Field(
        "float32",
        description="floating-point type of the features (and regression targets), the model and "
        "every client's computation; float64 for exact numerics",
    )

    @model_validator(mode="after")
    def _transform(self):
        if self.transform_params and self.cluster_transform is None:
            raise ValueError(
                f"transform_params {sorted(self.transform_params)} given without cluster_transform; "
                f"allowed: set data.cluster_transform (label_swap or rotation), or drop them"
            )
        if (self.dataset is None) == (self.target is None):
            raise ValueError(
                "give one of data.dataset (a registry name, fedsolve list datasets) and data.target "
                "(an import path 'package.module:function')" + (", not both" if self.dataset else "")
            )
        return self

    @property
    def label(self) -> str:
        """What the data is called in summaries and reports: the dataset name or the target's import path."""
        label = self.dataset or self.target
        assert label is not None, "the validator asks for one of data.dataset and data.target"
        return label

    @field_validator("sample_transform", mode="before")
    @classmethod
    def _transform_path(cls, v: Any) -> Any:
        return {"target": v} if isinstance(v, str) else v

    @field_validator("target")
    @classmethod
    def _target(cls, v: str | None) -> str | None:
        return v if v is None else _importable(v)

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str | None) -> str | None:
        from fedsolve.data.datasets import DATASETS

        if v is not None and v not in DATASETS:
            raise ValueError(f"unknown dataset {v!r}; allowed: {sorted(DATASETS)}, or an import path as data.target")
        return v

    @field_validator("partition")
    @classmethod
    def _partition(cls, v: str) -> str:
        from fedsolve.data.partition import PARTITIONERS

        if v not in PARTITIONERS:
            raise ValueError(f"unknown partition {v!r}; allowed: {sorted(PARTITIONERS)}")
        return v


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(
        None, description="model name (fedsolve list models); logreg when neither name nor target is given"
    )
    target: str | None = Field(
        None,
        description="import path 'package.module:factory' of a function or class "
        "that returns a torch.nn.Module, called with `params` (and "
        "input_shape / out_dim / num_classes from the data when it takes "
        "them and `params` does not set them)",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="model constructor parameters")
    blocks: dict[str, list[str]] = Field(
        default_factory=dict, description="named parameter blocks {name: [patterns]}, e.g. personal"
    )
    personalization: str | None = Field(
        None,
        description="preset for the 'personal' block: input | output | "
        "split-input (see fedsolve.families.personalized.blocks)",
    )
    buffers: Literal["average", "local"] = Field(
        "average",
        description="BatchNorm running statistics: 'average' (the server averages the participants' "
        "and scores every client with the average) or 'local' (each client keeps its own, "
        "FedBN); no effect on a model without BatchNorm layers",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        from fedsolve.models import MODELS

        if v is not None and v not in MODELS and not _extra_model(v):
            raise ValueError(
                f"unknown model {v!r}; allowed: {sorted(set(MODELS) | set(_extra_models()))}, or an "
                f"import path as model.target"
            )
        return v

    @field_validator("target")
    @classmethod
    def _target(cls, v: str | None) -> str | None:
        return v if v is None else _importable(v)

    @model_validator(mode="after")
    def _one(self):
        if self.name is not None and self.target is not None:
            raise ValueError("give one of model.name (a registry model) and model.target (an import path), not both")
        if self.target is None and self.name is None:
            self.name = "logreg"
        if self.personalization is not None and "personal" in self.blocks:
            raise ValueError(
                f"model.blocks.personal and model.personalization ({self.personalization!r}) both "
                f"define the personal block; allowed: one of them"
            )
        return self

    @property
    def label(self) -> str:
        """What the model is called in reports: its registry name or its target's import path."""
        label = self.name or self.target
        assert label is not None, "the validator sets model.name when model.target is not given"
        return label


def _extra_models() -> dict:
    try:
        from fedsolve.models import multimodal

        return getattr(multimodal, "MODELS", {})
    except ImportError:
        return {}


def _extra_model(name: str) -> bool:
    return name in _extra_models()


class ProblemConfig(BaseModel):
    """A family's problem on top of the data and model (constraints, bilevel splits, domain roles)."""

    model_config = ConfigDict(extra="forbid")
    kind: str = Field(
        ...,
        description="problem kind (fedsolve.problems.PROBLEM_KINDS), e.g. a constrained, bilevel or minimax problem",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="the problem kind's parameters")

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        from fedsolve.families import get_problem_kind

        get_problem_kind(v)  # raises with the allowed kinds
        return v


class TuneSpec(BaseModel):
    """Choose one hyper-parameter on validation data, per seed (the papers' "tuned on validation").

    Each client's training split is cut at random into train / validation (``val_fraction``); one run per
    grid value trains on the rest for ``rounds`` rounds and is scored on validation; the best value is then
    trained on the whole training split and scored on the test split, like an untuned run.
    """

    model_config = ConfigDict(extra="forbid")
    param: str = Field(..., description="the hyper-parameter to choose (a field of the algorithm's config)")
    grid: list[Any] = Field(..., min_length=2, description="candidate values, tried in this order (ties: first)")
    val_fraction: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="share of each client's training samples held out for validation (paper Sec. 6.1: 16/80 = 0.2)",
    )
    rounds: int | None = Field(
        None, ge=1, description="rounds of each tuning run (at most simulation.rounds); null = simulation.rounds"
    )
    metric: str | None = Field(
        None,
        description="validation metric (as reported, `test_*` on the validation "
        "split); null = test_accuracy, or test_rmse for regression",
    )
    widen: int = Field(
        0,
        ge=0,
        le=5,
        description="when the pick is the grid's smallest or largest value, tune again on as many new values "
        "beyond it (the grid's spacing continued, never across zero), up to this many times; the pick is the "
        "best of every value tried (needs a numeric grid); 0 = never",
    )

    @field_validator("grid")
    @classmethod
    def _distinct(cls, v: list[Any]) -> list[Any]:
        if len({json.dumps(x, sort_keys=True, default=str) for x in v}) != len(v):
            raise ValueError(f"grid values must be distinct, got {v}")
        return v

    @model_validator(mode="after")
    def _widen_needs_numbers(self) -> TuneSpec:
        if self.widen and not is_numeric(self.grid):
            raise ValueError(f"widen: {self.widen} needs a grid of numbers, got {self.grid}; allowed: 0 for this grid")
        return self


class AlgorithmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., description="algorithm name (fedsolve list algorithms)")
    label: str | None = Field(None, description="name shown in reports (default: name)")
    params: dict[str, Any] = Field(default_factory=dict, description="the algorithm's hyper-parameters")
    tune: TuneSpec | None = Field(
        None, description="choose one of `params` on validation data per seed (`fedsolve compare`); null = no tuning"
    )
    wrap: list[dict[str, Any]] = Field(
        default_factory=list,
        description="wrappers around the solver, in order: "
        "{kind: server_opt | dp | attack ..., params...} (fedsolve list wrappers)",
    )
    schedule: dict[str, Any] | None = Field(
        None,
        description="a protocol that steers the run round by round: "
        "{kind: warmup_path | lambda_grid | async_fpfc | virtual_clock ..., "
        "params...} (fedsolve list schedules); null = the configured rounds",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from fedsolve.families import ALGORITHMS

        if v not in ALGORITHMS:  # here, so that the message names the field: algorithm.name, algorithms.1.name
            raise ValueError(f"unknown algorithm {v!r}; allowed: {sorted(ALGORITHMS)} (fedsolve list algorithms)")
        return v

    def with_param(self, key: str, value: Any) -> AlgorithmSpec:
        """This spec with ``params[key] = value`` and no tuning (the run a tuned value is trained with)."""
        return self.model_copy(update={"params": {**self.params, key: value}, "tune": None})

    @property
    def display(self) -> str:
        return self.label or self.name


class ExperimentConfig(BaseModel):
    """A whole experiment: one problem, one or several algorithms, several seeds."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field("experiment", description="experiment name (run folder name)")
    description: str = Field("", description="free text shown in the report")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="seeds (compare runs each)")
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    problem: ProblemConfig | None = Field(
        None, description="a family's problem kind on top of data and model (null: plain empirical risk minimization)"
    )
    simulation: SimulationConfig = Field(default_factory=SimulationConfig)
    algorithm: AlgorithmSpec | None = Field(None, description="the algorithm of `fedsolve run`")
    algorithms: list[AlgorithmSpec] = Field(default_factory=list, description="algorithms of `fedsolve compare`")
    defaults: dict[str, Any] = Field(
        default_factory=dict,
        description="hyper-parameters applied to every algorithm that has them "
        "(a key that no registered algorithm has is refused)",
    )
    paper: dict[str, Any] = Field(default_factory=dict, description="the paper's numbers, shown next to ours")
    threads: int | None = Field(None, ge=1, description="torch threads (default: the physical cores)")
    out_dir: str = Field("runs", description="parent folder of run folders")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if any(s < 0 for s in v):
            raise ValueError("seeds must be non-negative integers")
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v

    @model_validator(mode="after")
    def _algos(self):
        from fedsolve.families import get_algorithm

        specs = ([self.algorithm] if self.algorithm else []) + list(self.algorithms)
        if not specs:
            raise ValueError("give `algorithm` (for run) or `algorithms` (for compare)")
        # a key no registered algorithm has is a typo; a key of other algorithms is a shared template's default
        from fedsolve.families import ALGORITHMS

        anywhere = {f for cls in ALGORITHMS.values() for f in cls.Config.model_fields}
        unknown = sorted(set(self.defaults) - anywhere)
        if unknown:
            mine = sorted({f for spec in specs for f in get_algorithm(spec.name).Config.model_fields})
            raise ValueError(
                f"defaults.{unknown[0]}: not a hyper-parameter of any algorithm; allowed (this "
                f"config's algorithms): {mine}"
            )
        for spec in specs:
            cls = get_algorithm(spec.name)
            params = merged_params(cls, self.defaults, spec.params)
            try:
                _plain_numbers(cls.Config, params, f"algorithm {spec.name!r} params")
                cls.Config(**params)
            except ValidationError as e:
                raise ValueError(
                    _format_validation(e, prefix=f"algorithm {spec.name!r} params", root=cls.Config)
                ) from None
            if spec.tune is not None:
                t = spec.tune
                if t.param not in cls.Config.model_fields:
                    raise ValueError(
                        f"algorithm {spec.name!r} tune.param: {t.param!r} is not a field of its "
                        f"config; allowed: {sorted(cls.Config.model_fields)}"
                    )
                for v in t.grid:
                    _plain_numbers(cls.Config, {t.param: v}, f"algorithm {spec.name!r} tune.grid value")
                    try:
                        cls.Config(**{**params, t.param: v})
                    except ValidationError as e:
                        raise ValueError(
                            _format_validation(
                                e, prefix=f"algorithm {spec.name!r} tune.grid value {v!r}", root=cls.Config
                            )
                        ) from None
        labels = [s.display for s in self.algorithms]
        if len(set(labels)) != len(labels):
            raise ValueError(f"algorithms: labels must be distinct, got {labels}; set `label`")
        from fedsolve.experiments.folders import slug
        from fedsolve.experiments.records import label_clash

        clash = label_clash(labels)
        if clash:  # one folder per label: `Fed Avg` and `Fed_Avg` would write into one
            raise ValueError(
                f"algorithms: labels {clash[0]!r} and {clash[1]!r} share the folder name "
                f"{slug(clash[1])!r}; allowed: labels that differ in letters, digits or -_."
            )
        return self

    def all_algorithms(self) -> list[AlgorithmSpec]:
        if self.algorithms:
            return list(self.algorithms)
        assert self.algorithm is not None, "the validator asks for algorithm or algorithms"
        return [self.algorithm]


def merged_params(cls, defaults: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` (only the keys the algorithm's config has) overridden by ``params``."""
    fields = cls.Config.model_fields
    out = {k: v for k, v in defaults.items() if k in fields}
    out.update(params)
    return out


def _format_validation(e: ValidationError, prefix: str = "", root: Any = None) -> str:
    """One line per error: the dotted field, what is wrong and what is allowed. ``root``: the model the
    error's locations start from (default :class:`ExperimentConfig`), for the allowed keys of a typo."""
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"] if x != "__root__")
        where = ".".join(p for p in (prefix, loc) if p)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
            parent = _model_at(err, root)
            if parent is not None:
                msg += f"; allowed keys: {sorted(parent)}"
        elif err["type"] == "literal_error":
            msg = f"{msg} (got {err.get('input')!r})"
        # a message from a validator already names its field ("algorithm 'x' params.y: ..."): no prefix
        lines.append(f"{where}: {msg}" if where else msg)
    return "; ".join(lines)


def _model_at(err, root: Any = None) -> dict | None:
    """Allowed keys of the model that rejected an extra key (best effort)."""
    model: Any = root or ExperimentConfig
    for part in err["loc"][:-1]:
        if isinstance(part, int):
            continue
        f = getattr(model, "model_fields", {}).get(part)
        if f is None:
            return None
        ann = f.annotation
        for cand in getattr(ann, "__args__", ()) or (ann,):
            if hasattr(cand, "model_fields"):
                model = cand
                break
        else:
            if hasattr(ann, "model_fields"):
                model = ann
            else:
                return None
    return getattr(model, "model_fields", None)


def _list_index(key: str, node: list, p: str) -> int:
    try:
        i = int(p)
    except ValueError:
        i = None
    if i is None or not 0 <= i < len(node):
        raise ConfigError(
            f"--set {key}: {p!r} is not an index of this list of {len(node)}; allowed: 0 to {len(node) - 1}"
            if node
            else f"--set {key}: the list is empty"
        )
    return i


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``["simulation.rounds=5", "algorithm.params.lr=0.1"]`` -> nested updates (values parsed as YAML)."""
    raw = copy.deepcopy(raw)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value (e.g. simulation.rounds=5)")
        key, val = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(
                f"--set {item!r}: the key has an empty part; expected dotted.key=value (e.g. simulation.rounds=5)"
            )
        node = raw
        for p in parts[:-1]:
            if isinstance(node, list):
                node = node[_list_index(key, node, p)]
            else:
                node = node.setdefault(p, {})
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"--set {key}: {p!r} is not a section (it holds {node!r})")
        last = parts[-1]
        try:
            value = yaml.safe_load(val)
        except yaml.YAMLError as e:
            raise ConfigError(
                f"--set {key}: {val!r} is not valid YAML ({getattr(e, 'problem', None) or e}); "
                f"allowed: a YAML value, e.g. 5, 0.1, [0, 1], {{a: 1}}, null"
            ) from None
        if isinstance(node, list):
            node[_list_index(key, node, last)] = value
        else:
            node[last] = value
    return raw


def _plain_numbers(model: Any, raw: Any, path: str = "") -> None:
    """Refuse ``true``/``false`` where ``model`` wants a number (pydantic would read ``true`` as 1) and NaN or an
    infinity where it wants a float (pydantic lets them through bounds such as ``> 0``), walking the nested
    models of ``raw`` (a config mapping)."""
    import math
    import typing

    if not isinstance(raw, dict) or not hasattr(model, "model_fields"):
        return
    for name, f in model.model_fields.items():
        if name not in raw:
            continue
        v, where = raw[name], f"{path}.{name}" if path else name
        ann = f.annotation
        args = typing.get_args(ann) or (ann,)
        if isinstance(v, bool) and bool not in args and any(a in (int, float) for a in args):
            kind = "an integer" if int in args else "a number"
            raise ConfigError(f"{where}: expected {kind}, got {v!r}")
        if isinstance(v, float) and not math.isfinite(v) and float in args:
            raise ConfigError(f"{where}: expected a finite number, got {v}; allowed: {_bounds_text(f)}")
        for a in args:
            if hasattr(a, "model_fields"):
                if isinstance(v, dict):
                    _plain_numbers(a, v, where)
                elif isinstance(v, list):
                    for i, x in enumerate(v):
                        _plain_numbers(a, x, f"{where}.{i}")
            elif typing.get_origin(a) is list and isinstance(v, list):
                inner = typing.get_args(a)
                if int in inner and any(isinstance(x, bool) for x in v):
                    raise ConfigError(f"{where}: expected integers, got {v!r}")
                if float in inner and any(isinstance(x, float) and not math.isfinite(x) for x in v):
                    raise ConfigError(f"{where}: expected finite numbers, got {v!r}")


def _bounds_text(f: Any) -> str:
    """A field's numeric bounds as text (``> 0, <= 1``), or ``a finite number``."""
    ops = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    parts = [f"{ops[k]} {getattr(m, k)}" for m in f.metadata for k in ops if getattr(m, k, None) is not None]
    return ", ".join(parts) or "a finite number"


def parse_config(raw: dict[str, Any]) -> ExperimentConfig:
    if not isinstance(raw, dict):
        raise ConfigError("config: the top level must be a mapping")
    _plain_numbers(ExperimentConfig, raw)
    try:
        return ExperimentConfig(**raw)
    except ValidationError as e:
        raise ConfigError(_format_validation(e)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a repeated key (plain YAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error on one line: what is wrong and where (line and column), without the echoed source."""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    return f"{problem}{f' (line {mark.line + 1}, column {mark.column + 1})' if mark is not None else ''}"


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    if path.is_dir():
        yamls = sorted(str(p) for p in path.glob("*.yaml"))[:5]
        raise ConfigError(
            f"config: {path} is a folder; give one experiment YAML file"
            + (f", e.g. {', '.join(yamls)}" if yamls else "")
        )
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config: cannot read {path}: {e}") from None
    return parse_config(apply_overrides(raw, overrides or []))


ExecutorName = Literal["auto", "sequential", "vectorized"]
