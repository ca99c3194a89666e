"""The documentation's own invariants: a short front door, a generated configuration page that matches the
schema, and no dates or machine names in the package (measurements live in benchmarks/results/)."""

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_a_front_door_of_at_most_150_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_configuration_page_matches_the_config_schema():
    generator = runpy.run_path(str(ROOT / "docs" / "generate_configuration.py"))
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == generator["render"](), "run: python docs/generate_configuration.py"


def test_configuration_page_lists_keys_with_their_schema_defaults():
    page = (ROOT / "docs" / "configuration.md").read_text()
    # Spot checks against the dataclasses' literal defaults (hybridrl/workers/config.py, ppo_config.py).
    assert "### `actor_rollout_ref.actor`" in page
    assert "- `clip_ratio` (float; default `0.2`)" in page
    assert "### `algorithm.kl_ctrl`" in page
    assert "- `kl_coef` (float; default `0.001`)" in page
    assert "### `optim`" in page  # the SFT schema's section


def test_package_code_names_no_dates_or_machines():
    pattern = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|EPYC|Xeon|H100|H200")
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in sorted((ROOT / "hybridrl").rglob("*")) if path.is_file() and path.suffix != ".pyc"
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if pattern.search(line)]
    assert not found, f"measurements and their machines belong in benchmarks/results/: {found}"
