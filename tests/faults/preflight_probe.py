"""Run `run_ppo` on broken inputs in a fresh interpreter and report how each run ended.

A fault test must show that a bad row or setting fails *before Ray starts*. In-process that cannot be
observed afterwards: `ray_for_backend` shuts down a Ray it started, and an earlier test may have
imported Ray. A fresh interpreter can tell: `run_ppo` imports Ray only where it starts it, so
`"ray" in sys.modules` after the failure says whether the run got that far.

    run_probes({"name": [override, ...], ...}) -> {"name": ProbeResult, ...}

runs this file as a script (one interpreter for all probes, in order) with the overrides as JSON on
stdin; each result holds the exception's type and message, the seconds `run_ppo` took to fail, the
backend the config asked for and whether Ray had been imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAINER_TESTS = REPO / "tests" / "trainer"


@dataclass
class ProbeResult:
    error: str | None  # the exception's class name; None if the run finished
    message: str
    seconds: float
    backend: str
    ray_imported: bool


def run_probes(probes: dict[str, list[str]], timeout: float = 300) -> dict[str, ProbeResult]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TRAINER_TESTS),
                                                       os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, __file__], input=json.dumps(probes), capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the probe interpreter failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return {name: ProbeResult(**result) for name, result in json.loads(lines[-1]).items()}


def _main() -> None:
    from omegaconf import OmegaConf
    from ppo_helpers import ppo_config

    from hybridrl.trainer.main_ppo import run_ppo

    results = {}
    for name, overrides in json.load(sys.stdin).items():
        cfg = ppo_config(*overrides)
        backend = OmegaConf.select(cfg, "trainer.backend")
        start = time.perf_counter()
        error, message = None, ""
        try:
            run_ppo(cfg)
        except Exception as exc:  # noqa: BLE001 - the probe reports whatever ended the run
            error, message = type(exc).__name__, str(exc)
        results[name] = {"error": error, "message": message, "seconds": time.perf_counter() - start,
                         "backend": backend, "ray_imported": "ray" in sys.modules}
    print(json.dumps(results))


if __name__ == "__main__":
    _main()
