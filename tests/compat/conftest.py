"""Puts compat/ on sys.path: its verl_* modules are verl's call conventions over the core, imported by name
(as compat/verl_shim.py maps verl's modules to them), never by hybridrl. Also tests/trainer, for the trainer
tests' helpers."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for folder in (TESTS.parent / "compat", TESTS / "trainer"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
