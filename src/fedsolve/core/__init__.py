"""Core mechanics shared by every solver: layouts, client states, RNG, executors, accounting."""

from fedsolve.core.comm import CommLedger, record_bytes, row_bytes
from fedsolve.core.context import LocalContext
from fedsolve.core.executor import SequentialExecutor, VectorizedExecutor
from fedsolve.core.layout import ParamLayout, patterns_for
from fedsolve.core.plans import Plan, Work, build_plans
from fedsolve.core.rng import RngStreams
from fedsolve.core.selection import make_executor
from fedsolve.core.states import ClientStates, repeat_rows

__all__ = [
    "CommLedger",
    "record_bytes",
    "row_bytes",
    "LocalContext",
    "Plan",
    "SequentialExecutor",
    "VectorizedExecutor",
    "Work",
    "build_plans",
    "make_executor",
    "ParamLayout",
    "patterns_for",
    "RngStreams",
    "ClientStates",
    "repeat_rows",
]
