"""Checks made before a run starts any worker, so a reward that cannot be computed fails at once."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from hybridrl.rewards.sandbox import SandboxLimits, SandboxUnavailableError, require_sandbox
from hybridrl.rewards.score import sandbox_sources

logger = logging.getLogger(__name__)


def check_code_sandbox(data_sources: Iterable[object], limits: SandboxLimits) -> None:
    """Raise SandboxUnavailableError when the built-in scorer of one of `data_sources` runs programs and
    the sandbox cannot run them here with `limits`; warn when it runs them in the weaker mode."""
    sources = sandbox_sources(str(source) for source in data_sources)
    if not sources:
        return
    try:
        isolation = require_sandbox(limits)
    except SandboxUnavailableError as err:
        raise SandboxUnavailableError(f"data sources {sources} are scored by running programs, but {err}") from None
    refused = [name for name, entered in isolation.items() if not entered]
    if refused:
        logger.warning("code sandbox in the weaker uid-only mode (reward_model.sandbox.require_isolation=false): "
                       "the kernel refused the %s namespace(s), so programs of %s can reach the network (local "
                       "Ray services included) and read world-readable files; see hybridrl/rewards/SANDBOX.md", refused, sources)
