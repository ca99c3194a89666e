"""Every reference in the project's comments, docstrings and documents resolves inside the repository.

Read: comments and docstrings of the Python files, comments of the YAML files, and the Markdown files,
under hybridrl/, benchmarks/ and docs/, and README.md. (compat/ is left out: it runs verl's own tests
and names verl's files on purpose.) Three kinds of reference are checked:

- a path: `hybridrl/workers/checkpoint.py`, `results/learning.md`, a bare `SANDBOX.md`. A path resolves
  from the repository root, from the citing file's folder or from a folder above it; a bare file name
  (no folder) resolves if the repository has a file of that name. Paths with placeholders
  (`global_step_N/<role>`, `*_on_cpu.py`) and paths into hidden folders (virtual environments, caches)
  name things a run makes, not files of the repository;
- a module: `hybridrl.workers.checkpoint.CheckpointManager` must name a module of the package and,
  after it, a name that module defines or imports;
- a section: `docs/architecture.md, "One PPO step"` must name a heading of that document.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCOPE = ["hybridrl", "benchmarks", "docs", "README.md"]
TOP_FOLDERS = ("hybridrl/", "tests/", "benchmarks/", "docs/", "compat/")
CHECKED_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".sh", ".txt", ".toml")  # sources and documents
# File names used as examples of files that are not the repository's
EXAMPLE_NAMES = {
    "my_reward.py": "README: the user's own reward function file",
    "main.py": "hybridrl/rewards/sandbox.py: the file the sandbox writes a program into",
}

PATH = re.compile(r"(?<![\w./<{-])((?:[\w.-]+/)+[\w.*<>{}-]*|[\w-]+\.(?:py|md|yaml|sh))(?![\w/])")
MODULE = re.compile(r"(?<![\w.])hybridrl(?:\.\w+)+")
SECTION = re.compile(r"([\w./-]+\.md),\s*\"([^\"]+)\"")


def scope_files() -> list[Path]:
    files = []
    for entry in SCOPE:
        path = REPO / entry
        candidates = [path] if path.is_file() else path.rglob("*")
        files += [p for p in candidates if p.suffix in (".py", ".md", ".yaml", ".yml") and p.is_file()
                  and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(REPO).parts)]
    return sorted(files)


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of the parts of `path` written for readers: comments, docstrings, Markdown."""
    source = path.read_text()
    if path.suffix == ".md":
        yield from enumerate(source.splitlines(), 1)
        return
    if path.suffix in (".yaml", ".yml"):
        for number, line in enumerate(source.splitlines(), 1):
            if "#" in line:
                yield number, line[line.index("#"):]
        return
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def path_resolves(ref: str, citing: Path, names: set[str]) -> bool:
    name = ref.rstrip("/")
    if "/" not in name:
        return name in names or name in EXAMPLE_NAMES
    bases = [REPO, *[p for p in citing.parents if p.is_relative_to(REPO)]]
    return any((base / ref).exists() for base in bases)


def path_references(text: str) -> Iterator[str]:
    for match in PATH.finditer(text):
        ref = match.group(1).rstrip(".,:;")
        if any(c in ref for c in "*<>{}") or "..." in ref:
            continue  # a placeholder: something a run makes
        if any(part.startswith(".") and part not in (".", "..") for part in ref.split("/")):
            continue  # a hidden folder: an environment or a cache
        if ref.endswith(CHECKED_SUFFIXES) or ref.startswith(TOP_FOLDERS):
            yield ref


def module_defines(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def module_resolves(ref: str) -> bool:
    """`hybridrl.a.b.name`: the longest module prefix exists and defines the name after it."""
    parts, folder, module = ref.split("."), REPO, None
    for i, part in enumerate(parts):
        if (folder / part / "__init__.py").is_file():
            folder, module = folder / part, folder / part / "__init__.py"
        elif (folder / f"{part}.py").is_file():
            module = folder / f"{part}.py"
            rest = parts[i + 1:]
            break
        else:
            rest = parts[i:]
            break
    else:
        return True
    if module is None:
        return False
    return not rest or rest[0] in module_defines(module)


def headings(path: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")}


def broken_references(path: Path, names: set[str]) -> list[str]:
    broken = []
    where = path.relative_to(REPO)
    for line, text in prose(path):
        broken += [f"{where}:{line}: {ref}" for ref in path_references(text)
                   if not path_resolves(ref, path, names)]
        broken += [f"{where}:{line}: {m.group(0)}" for m in MODULE.finditer(text)
                   if not module_resolves(m.group(0).rstrip("."))]
        for match in SECTION.finditer(text):
            doc, title = match.groups()
            target = next((base / doc for base in [REPO, *path.parents] if (base / doc).is_file()), None)
            if target is not None and title not in headings(target):
                broken.append(f"{where}:{line}: {doc}, \"{title}\" (no such heading)")
    return broken


def ignored_folders() -> tuple[set[str], set[str]]:
    """Folders the top-level .gitignore names, (anywhere, top level only): what runs and tools make."""
    gitignore = REPO / ".gitignore"
    lines = [line.strip() for line in (gitignore.read_text().splitlines() if gitignore.is_file() else [])]
    folders = [line for line in lines if line.endswith("/") and "*" not in line]
    return ({f.strip("/") for f in folders if not f.startswith("/")},
            {f.strip("/") for f in folders if f.startswith("/")})


@pytest.fixture(scope="module")
def repo_names() -> set[str]:
    """The names of the repository's own files and folders (not environments, caches or run outputs)."""
    anywhere, top = ignored_folders()
    names = set()
    for folder, dirs, files in os.walk(REPO):
        skip = anywhere | (top if Path(folder) == REPO else set())
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in skip and not d.endswith(".egg-info")]
        names |= set(files) | set(dirs)
    return names


def test_checker_finds_what_is_missing(repo_names):
    # independent cases, written by hand: two that resolve, five that do not
    cited = REPO / "hybridrl" / "trainer" / "example.py"
    text = ('see DESIGN.md section 4, hybridrl/workers/checkpoint.py, results/missing.md, '
            'config/ppo_trainer.yaml, hybridrl.workers.checkpoint.find_latest_ckpt_path, '
            'hybridrl.workers.checkpoint_resume.find_latest_ckpt_path, docs/architecture.md, "No such part", '
            'global_step_N/<role>/model.py and benchmarks/.venv-trl/bin/python')
    refs = list(path_references(text))
    assert [r for r in refs if not path_resolves(r, cited, repo_names)] == ["DESIGN.md", "results/missing.md"]
    assert "config/ppo_trainer.yaml" in refs  # found from hybridrl/trainer/, a folder above the citing file
    assert [m.group(0) for m in MODULE.finditer(text) if not module_resolves(m.group(0))] == [
        "hybridrl.workers.checkpoint.find_latest_ckpt_path"]
    assert "No such part" not in headings(REPO / "docs" / "architecture.md")
    assert "One PPO step" in headings(REPO / "docs" / "architecture.md")


def test_every_reference_resolves(repo_names):
    files = scope_files()
    assert REPO / "docs" / "architecture.md" in files and REPO / "README.md" in files
    broken = [b for path in files for b in broken_references(path, repo_names)]
    assert broken == []
