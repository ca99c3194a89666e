"""Which config keys hybridrl's source reads: a static scan behind the config-walk test.

Why a scan of the source rather than a registry of readers or a traced run: a registry is a second
list that can claim a read the code does not do, and a traced run sees only the branches one
configuration takes (the critic's keys need GAE, the reward model's need a model). The scan reads the
code itself, every branch, in about a second.

A key counts as read when the code reads it in one of three ways:
  1. through a chain ending in enough of the key's path to tell it from every other key:
     `config.algorithm.use_pf_ppo`, `cfg["reward_model"]["overlong_buffer"]["log"]`, a local alias
     (`kl = config.algorithm.kl_ctrl` ... `kl.horizon`), or the bare name when no other key has it
     and it is a compound name (`launch_reward_fn_async`, not `seed`);
  2. on an expression whose config class the scan can tell: a parameter annotated `config: CriticConfig`,
     `self.config = to_dataclass(CriticConfig, ...)`, a call of a function annotated to return one, a
     field of one, `self` in one's own methods. So `self.config.ppo_epochs` in the critic worker reads
     critic.ppo_epochs and not actor.ppo_epochs;
  3. as a whole node unpacked into a call (`get_kl_controller(**vars(config.algorithm.kl_ctrl))`,
     `SandboxConfig(**sandbox)`), where Python refuses a keyword the callee does not take.
Accesses inside `__post_init__` and in the modules that only check values (`SKIPPED_MODULES`) validate a
setting; they do not use it, so they do not count.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import typing
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

Chain = tuple[str, ...]

SKIPPED_MODULES = ("trainer/config_checks.py", "trainer/config_rules.py")


@dataclasses.dataclass(frozen=True)
class SchemaKey:
    path: Chain  # ("actor_rollout_ref", "actor", "ppo_epochs")
    owner: type  # the dataclass that declares the field

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _dataclasses_in(hint: object) -> list[type]:
    """The dataclass types a field's annotation names (`A`, `A | None`, `list[A]`)."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return [hint]
    return [t for arg in typing.get_args(hint) for t in _dataclasses_in(arg)]


def schema_keys(root: type, prefix: Chain = ()) -> list[SchemaKey]:
    """Every leaf key of a config dataclass tree (an open dict field is one leaf)."""
    keys: list[SchemaKey] = []
    hints = typing.get_type_hints(root)
    for f in dataclasses.fields(root):
        nested = _dataclasses_in(hints[f.name])
        if nested:
            keys += schema_keys(nested[0], (*prefix, f.name))
        else:
            keys.append(SchemaKey((*prefix, f.name), root))
    return keys


def schema_classes(roots: Iterable[type]) -> dict[str, type]:
    """Every dataclass of the trees, by class name."""
    found: dict[str, type] = {}
    todo = list(roots)
    while todo:
        cls = todo.pop()
        if cls.__name__ in found:
            continue
        found[cls.__name__] = cls
        hints = typing.get_type_hints(cls)
        todo += [t for f in dataclasses.fields(cls) for t in _dataclasses_in(hints[f.name])]
        # a base dataclass too: code may read the inherited fields through it (RLDatasetConfig of DataConfig)
        todo += [base for base in cls.__mro__[1:] if dataclasses.is_dataclass(base)]
    return found


@dataclasses.dataclass
class Evidence:
    chains: dict[str, set[Chain]] = dataclasses.field(default_factory=lambda: defaultdict(set))  # by last name
    typed: set[tuple[type, str]] = dataclasses.field(default_factory=set)  # (config class, field) read on it
    whole_chains: set[Chain] = dataclasses.field(default_factory=set)  # nodes unpacked whole
    whole_types: set[type] = dataclasses.field(default_factory=set)

    def add_chain(self, chain: Chain | None) -> None:
        if chain:
            self.chains[chain[-1]].add(chain)


@dataclasses.dataclass
class Env:
    """What the scan knows about local names: the chain each aliases and the config classes it may hold."""

    chains: dict[str, Chain] = dataclasses.field(default_factory=dict)
    types: dict[str, set[type]] = dataclasses.field(default_factory=dict)
    self_types: dict[str, set[type]] = dataclasses.field(default_factory=dict)  # self.<attr> in this class

    def copy(self) -> Env:
        return Env(dict(self.chains), {k: set(v) for k, v in self.types.items()}, self.self_types)


class _Scanner:
    def __init__(self, classes: dict[str, type], returns: dict[str, set[type]], evidence: Evidence) -> None:
        self.classes, self.returns, self.evidence = classes, returns, evidence

    # ----- expressions ---------------------------------------------------------------------------------
    def annotation_types(self, node: ast.expr | None) -> set[type]:
        if node is None:
            return set()
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        names |= {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        return {self.classes[name] for name in names if name in self.classes}

    def chain(self, node: ast.expr, env: Env) -> Chain | None:
        if isinstance(node, ast.Name):
            return env.chains.get(node.id, (node.id,))
        if isinstance(node, ast.Attribute):
            base = self.chain(node.value, env)
            return None if base is None else (*base, node.attr)
        if isinstance(node, ast.Subscript) and _str(node.slice) is not None:
            base = self.chain(node.value, env)
            return None if base is None else (*base, _str(node.slice))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and _str(node.args[0]) is not None:
            base = self.chain(node.func.value, env)
            return None if base is None else (*base, _str(node.args[0]))
        if isinstance(node, ast.BoolOp):  # `section or {}`
            return self.chain(node.values[0], env)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("dict", "vars") \
                and len(node.args) == 1:
            return self.chain(node.args[0], env)
        return None

    def types(self, node: ast.expr, env: Env) -> set[type]:
        if isinstance(node, ast.Name):
            return env.types.get(node.id, set())
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in env.self_types:
                return env.self_types[node.attr]
            found: set[type] = set()
            for cls in self.types(node.value, env):
                hint = _hints(cls).get(node.attr)
                found |= {t for t in _dataclasses_in(hint) if t.__name__ in self.classes}
            return found
        if isinstance(node, ast.BoolOp):
            return self.types(node.values[0], env)
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else None
            if name == "to_dataclass" and node.args:
                return self.annotation_types(node.args[0])
            if name in ("replace", "vars") and node.args:  # a copy, or the fields as a dict
                return self.types(node.args[0], env)
            if name in self.classes:
                return {self.classes[name]}
            return set(self.returns.get(name or "", set()))
        return set()

    # ----- statements ----------------------------------------------------------------------------------
    def record(self, node: ast.AST, env: Env) -> None:
        """Evidence from every read in `node` (an expression or statement), given `env`."""
        for sub in _walk_shallow(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load):
                self.evidence.add_chain(self.chain(sub, env))
                self.evidence.typed |= {(cls, sub.attr) for cls in self.types(sub.value, env)}
            elif isinstance(sub, ast.Subscript) and _str(sub.slice) is not None:
                self.evidence.add_chain(self.chain(sub, env))
                self.evidence.typed |= {(cls, _str(sub.slice)) for cls in self.types(sub.value, env)}
            elif isinstance(sub, ast.Call):
                self.evidence.add_chain(self.chain(sub, env))
                for kw in sub.keywords:
                    if kw.arg is None:  # **node: every key of it goes to the callee
                        chain = self.chain(kw.value, env)
                        if chain:
                            self.evidence.whole_chains.add(chain)
                        self.evidence.whole_types |= self.types(kw.value, env)
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.isidentifier():
                self.evidence.add_chain((sub.value,))  # a name in a table of keys read by string

    def body(self, statements: list[ast.stmt], env: Env) -> None:
        for stmt in statements:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.function(stmt, env)
            elif isinstance(stmt, ast.ClassDef):
                self.klass(stmt, env)
            else:
                self.record(stmt, env)
                self.bind(stmt, env)
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(stmt, field, []):
                        self.body(child.body if isinstance(child, ast.ExceptHandler) else [child], env)

    def bind(self, stmt: ast.stmt, env: Env) -> None:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name, value = stmt.targets[0].id, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            name, value = stmt.target.id, stmt.value
            env.types[name] = self.annotation_types(stmt.annotation)
        else:
            return
        chain = self.chain(value, env)
        if chain is not None and len(chain) > 1:
            env.chains[name] = chain
        env.types[name] = env.types.get(name, set()) | self.types(value, env)

    def function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, env: Env, self_cls: type | None = None) -> None:
        if node.name == "__post_init__":
            return
        local = env.copy()
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            local.chains.pop(arg.arg, None)
            local.types[arg.arg] = self.annotation_types(arg.annotation)
        if self_cls is not None:
            local.types["self"] = {self_cls}
        for default in [*args.defaults, *args.kw_defaults]:
            if default is not None:
                self.record(default, env)
        self.body(node.body, local)

    def klass(self, node: ast.ClassDef, env: Env) -> None:
        """Methods see `self.<attr>` typed by what any method assigns to it, or by the class body's annotation
        of it (`config: ActorConfig` in a subclass of a base that assigns it)."""
        cls = self.classes.get(node.name)
        self_types: dict[str, set[type]] = defaultdict(set)
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                self_types[stmt.target.id] |= self.annotation_types(stmt.annotation)
        for method in node.body:
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local = Env()
                for arg in method.args.args:
                    local.types[arg.arg] = self.annotation_types(arg.annotation)
                for stmt in ast.walk(method):
                    if isinstance(stmt, ast.Assign):
                        for target in stmt.targets:
                            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                    and target.value.id == "self":
                                self_types[target.attr] |= self.types(stmt.value, local)
        class_env = Env(dict(env.chains), {k: set(v) for k, v in env.types.items()}, dict(self_types))
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.function(stmt, class_env, self_cls=cls)
            else:
                self.record(stmt, class_env)


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _walk_shallow(node: ast.AST) -> Iterator[ast.AST]:
    """Nodes of one statement, not descending into nested statements (the body walk visits those)."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        for field, value in ast.iter_fields(current):
            if field in ("body", "orelse", "finalbody", "handlers") and isinstance(current, ast.stmt):
                continue
            children = value if isinstance(value, list) else [value]
            todo += [c for c in children if isinstance(c, ast.AST)]


@functools.cache
def _parse(name: str, text: str) -> ast.Module:
    return ast.parse(text, filename=name)


def _returns(trees: Iterable[ast.Module], classes: dict[str, type]) -> dict[str, set[type]]:
    """Config classes each function name is annotated to return (`resolve_config -> PPOTrainerConfig`)."""
    scanner = _Scanner(classes, {}, Evidence())
    found: dict[str, set[type]] = defaultdict(set)
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[node.name] |= scanner.annotation_types(node.returns)
    return found


def scan_sources(sources: dict[str, str], roots: Iterable[type]) -> Evidence:
    """Evidence of reads in `sources` ({file name: Python source}) for the config trees under `roots`."""
    classes = schema_classes(roots)
    trees = [_parse(name, text) for name, text in sources.items()]
    evidence = Evidence()
    scanner = _Scanner(classes, _returns(trees, classes), evidence)
    for tree in trees:
        scanner.body(tree.body, Env())
    return evidence


def package_sources(package_dir: Path) -> dict[str, str]:
    """Every module of the package but the ones that only check values."""
    return {str(p): p.read_text() for p in sorted(package_dir.rglob("*.py"))
            if not any(str(p.relative_to(package_dir)) == skipped for skipped in SKIPPED_MODULES)}


def distinguishing_suffix(key: SchemaKey, all_paths: set[Chain]) -> Chain:
    """The shortest end of the key's path that no other key's path ends with.

    A bare name is enough only for a compound one (`launch_reward_fn_async`): one-word names (`device`,
    `seed`, `log`) are everyday attribute names, so those need their parent too (`trainer.device`).
    """
    for size in range(1 if "_" in key.path[-1] else min(2, len(key.path)), len(key.path) + 1):
        suffix = key.path[-size:]
        if not any(p != key.path and p[-size:] == suffix for p in all_paths):
            return suffix
    return key.path


def unread_keys(keys: list[SchemaKey], evidence: Evidence) -> list[str]:
    """The keys nothing reads, by the rules of the module docstring."""
    all_paths = {k.path for k in keys}
    unread = []
    for key in keys:
        suffix = distinguishing_suffix(key, all_paths)
        parent = key.path[:-1]
        parent_suffix = parent[-len(suffix) + 1:] if len(suffix) > 1 else parent[-1:]
        read = (
            # a read typed as a base class reads the field its subclasses inherit (DataConfig's from RLDatasetConfig)
            any(field == key.path[-1] and issubclass(key.owner, cls) for cls, field in evidence.typed)
            or key.owner in evidence.whole_types
            or any(c[-len(suffix):] == suffix for c in evidence.chains.get(key.path[-1], ()))
            or any(parent_suffix and c[-len(parent_suffix):] == parent_suffix for c in evidence.whole_chains)
        )
        if not read:
            unread.append(key.dotted)
    return unread
