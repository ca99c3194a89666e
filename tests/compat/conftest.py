"""Puts compat/ on sys.path: its verl_* modules are verl's call conventions over the core, imported by name
(as compat/verl_shim.py maps verl's modules to them), never by hybridrl."""

import sys
from pathlib import Path

COMPAT_DIR = Path(__file__).resolve().parents[2] / "compat"
if str(COMPAT_DIR) not in sys.path:
    sys.path.insert(0, str(COMPAT_DIR))
