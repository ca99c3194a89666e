"""Rule-based scorers and `default_compute_score`, which picks one by `data_source` as verl does."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridrl.rewards.sandbox import SandboxLimits

from hybridrl.rewards.failures import RewardFunctionFatalError

# data_source -> scorer module. Matches verl's `default_compute_score` for the sources both know,
# plus `countdown` (TinyZero) and `arithmetic` (hybridrl's default task).
_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math": "math",
    "countdown": "countdown",
    "arithmetic": "arithmetic",
    "codecontests": "code",
    "apps": "code",
    "codeforces": "code",
    "taco": "code",
    "likaixin/TACO-verified": "code",
    "deepmind/code_contests": "code",
    "codeparrot/apps": "code",
}
# Prefix families (e.g. "aime24", "aime2025"), checked after exact names.
_PREFIXES: dict[str, str] = {"aime": "math", "math_": "math", "countdown": "countdown"}


class UnknownDataSourceError(RewardFunctionFatalError, NotImplementedError):
    """No built-in scorer for a row's data source: a setup error, so it stops the run rather than
    scoring the row 0.0 (a NotImplementedError, as verl raises)."""


def known_sources() -> list[str]:
    return sorted(_SOURCES) + [f"{prefix}*" for prefix in sorted(_PREFIXES)]


def scorer_module_name(data_source: str) -> str:
    """Name of the `hybridrl.rewards.score` module that scores `data_source`."""
    if data_source in _SOURCES:
        return _SOURCES[data_source]
    for prefix, module in _PREFIXES.items():
        if data_source.startswith(prefix):
            return module
    raise UnknownDataSourceError(
        f"no built-in reward function for data_source={data_source!r}. Known sources: "
        f"{', '.join(known_sources())}. For another source set custom_reward_function.path "
        f"(and .name) to a file defining compute_score(data_source, solution_str, ground_truth, extra_info=None)."
    )


def sandbox_sources(data_sources: Iterable[str]) -> list[str]:
    """The data sources among `data_sources` whose built-in scorer runs programs in the code sandbox
    (sources without a built-in scorer are left to fail where they are scored)."""
    found = set()
    for source in set(data_sources):
        try:
            module = importlib.import_module(f"{__name__}.{scorer_module_name(source)}")
        except NotImplementedError:
            continue
        if getattr(module, "USES_SANDBOX", False):
            found.add(source)
    return sorted(found)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    sandbox_limits: SandboxLimits | None = None,
    **kwargs: Any,
) -> float | dict:
    """Score one response with the scorer registered for its `data_source`.

    Extra keyword arguments go to the scorer (e.g. `method="flexible"` for gsm8k, `format_score=...`);
    `sandbox_limits` only to scorers that run programs (`USES_SANDBOX`). Returns a float, or the
    scorer's dict (with a `score` key) unchanged.
    """
    module = importlib.import_module(f"{__name__}.{scorer_module_name(data_source)}")
    if sandbox_limits is not None and getattr(module, "USES_SANDBOX", False):
        kwargs = {**kwargs, "sandbox_limits": sandbox_limits}
    result = module.compute_score(solution_str, ground_truth, **kwargs)
    if isinstance(result, dict):
        return result
    return float(result)
