"""The demos in the repository's examples/ folder are scripts, not package modules: import them from there."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
