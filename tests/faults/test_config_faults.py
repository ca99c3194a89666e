"""Bad settings end a Ray run with 2 workers before Ray starts, naming the key and the fix.

Issue 19's probes: a negative learning rate failed inside torch's AdamW after Ray had started, without
naming the key, and a misspelt `+key=value` override was accepted and silently ignored. All probes run
in one fresh interpreter (`preflight_probe`), which also tells whether Ray was imported.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ppo_helpers import tiny_run_overrides
from preflight_probe import ProbeResult, run_probes

RAY_RUN = ["trainer.backend=ray", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2"]

PROBES = {
    "negative_lr": ["actor_rollout_ref.actor.optim.lr=-1e-3"],
    "plus_typo": ["+actor_rollout_ref.actor.optim.lrr=1e-3"],
    "plus_plus_typo": ["++trainer.n_gpus_per_nod=1"],
    "two_ranges": ["algorithm.gamma=1.5", "actor_rollout_ref.actor.clip_ratio_c=0.5"],
    "critic_lr_under_gae": ["algorithm.adv_estimator=gae", "critic.optim.lr=-1"],
}


@pytest.fixture(scope="module")
def probes(fault_data: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ProbeResult]:
    root = tmp_path_factory.mktemp("bad_settings")
    return run_probes({name: [*tiny_run_overrides(fault_data, tiny_model_dir, root / name), *RAY_RUN, *faults]
                       for name, faults in PROBES.items()})


@pytest.mark.parametrize("probe, messages", [
    ("negative_lr", [r"actor_rollout_ref.actor.optim.lr=-0.001 is out of range: it must be >= 0. "
                     r"Fix: e.g. actor_rollout_ref.actor.optim.lr=1e-06"]),
    ("plus_typo", [r"unknown config key actor_rollout_ref.actor.optim.lrr, .*did you mean "
                   r"actor_rollout_ref.actor.optim.lr\?"]),
    ("plus_plus_typo", [r"unknown config key trainer.n_gpus_per_nod, .*did you mean trainer.n_gpus_per_node\?"]),
    ("two_ranges", [r"algorithm.gamma=1.5 is out of range: it must be in \[0, 1\]",
                    r"actor_rollout_ref.actor.clip_ratio_c=0.5 is out of range: it must be > 1"]),
    ("critic_lr_under_gae", [r"critic.optim.lr=-1.0 is out of range: it must be >= 0"]),
])
def test_a_bad_setting_fails_before_ray_starts_naming_the_key(probes, probe, messages):
    result = probes[probe]
    assert result.backend == "ray"
    assert result.error == "ConfigError", result.message
    for message in messages:
        assert re.search(message, result.message), result.message
    assert "Fix" in result.message
    assert not result.ray_imported  # the run stopped before it started (or even imported) Ray
    assert result.seconds < 60, result.seconds
