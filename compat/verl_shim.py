"""A pytest plugin that lets verl's own unit tests import hybridrl under verl's module names.

It renames, and does nothing else: each verl module a test imports is replaced by the module listed in
`MODULES`, a hybridrl module or one of this folder's (verl_*.py: the core's names and verl's call
conventions over them), and the one top-level name verl's tests take from the `verl` package is listed
in `TOP_LEVEL_NAMES`. Every package on the way to a listed module (`verl`, `verl.trainer`, ...) is an
empty stand-in package, so nothing of hybridrl is patched and no verl code is ever run.

Loaded with `python -m pytest -p verl_shim` (see run_verl_tests.py); the finder is installed when this
module is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

# verl module -> the module that provides the same names (the verl_* ones are in this folder).
MODULES = {
    "verl.protocol": "verl_protocol",
    "verl.trainer.ppo.core_algos": "verl_core_algos",
    "verl.trainer.ppo.rollout_corr_helper": "verl_core_algos",
    "verl.trainer.ppo.ray_trainer": "verl_trainer",
    "verl.trainer.ppo.v1.utils": "verl_trainer",
    "verl.trainer.config.algorithm": "verl_trainer",
    "verl.workers.config.actor": "hybridrl.workers.config",
    "verl.utils.torch_functional": "hybridrl.utils.torch_functional",
    "verl.utils.tensordict_utils": "verl_protocol",
    "verl.utils.metric": "verl_metric",
    "verl.utils.py_functional": "verl_metric",
    "verl.utils.seqlen_balancing": "verl_seqlen_balancing",
}

# `from verl import X`: verl re-exports these at its top level.
TOP_LEVEL_NAMES = {"DataProto": ("verl_protocol", "DataProto")}


def _stand_in_packages() -> set[str]:
    """Every proper prefix of a mapped name (verl, verl.trainer, verl.trainer.ppo, ...)."""
    prefixes = set()
    for name in MODULES:
        parts = name.split(".")
        prefixes.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return prefixes


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        """The hybridrl module is already imported; there is nothing to run."""


class _EmptyPackageLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default: a new, empty module

    def exec_module(self, module) -> None:
        module.__path__ = []  # a package, so its mapped children can be imported
        for attribute, (source, name) in TOP_LEVEL_NAMES.items():
            if module.__name__ == "verl":
                setattr(module, attribute, getattr(importlib.import_module(source), name))


class VerlToHybridrlFinder(importlib.abc.MetaPathFinder):
    """Resolves `verl.*` imports from the tables above; any other verl module is not found."""

    def __init__(self) -> None:
        self.packages = _stand_in_packages()

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MODULES:
            module = importlib.import_module(MODULES[fullname])
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(module))
        if fullname in self.packages:
            return importlib.machinery.ModuleSpec(fullname, _EmptyPackageLoader(), is_package=True)
        if fullname == "verl" or fullname.startswith("verl."):
            raise ModuleNotFoundError(f"{fullname} has no counterpart in compat/verl_shim.py")
        return None


def install() -> None:
    if not any(isinstance(finder, VerlToHybridrlFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, VerlToHybridrlFinder())


install()
