"""The built-in rule-based reward functions, one per task, and `default_compute_score`, which picks one by
`data_source` as verl does. Standard library only (math-verify is imported when first needed): importing
`hybridrl.rewards` loads this module, and the code sandbox must load under a bare interpreter."""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import operator
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Any

from hybridrl.rewards.failures import RewardFunctionFatalError
from hybridrl.rewards.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    require_sandbox,
    run_many,
)

logger = logging.getLogger(__name__)


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INTEGER = re.compile(r"[+-]?\d+")


def extract_answer(solution_str: str) -> str | None:
    """Content of the last `<answer>...</answer>` pair, stripped; None if there is none."""
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def arithmetic_score(solution_str: str, ground_truth: str | int, format_score: float = 0.0,
                     score: float = 1.0) -> float:
    """`score` if the last `<answer>` tag holds the integer `ground_truth`, `format_score` if it holds
    anything else, 0.0 without a tag (only the last tag counts, so listing answers cannot hedge)."""
    try:
        target = int(str(ground_truth).strip())
    except ValueError:
        raise ValueError(f"arithmetic ground_truth must be an integer string such as '85' or '-12', got "
                         f"{ground_truth!r}") from None
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    if _INTEGER.fullmatch(answer) and int(answer) == target:
        return score
    return format_score


# longer expressions cannot be legitimate for a handful of numbers
_MAX_EXPR_CHARS = 512
# exact Fraction arithmetic: the countdown allows the first four, the calculator tool (hybridrl/tools) all
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_COUNTDOWN_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)
MAX_EXPONENT = 64
MAX_BITS = 4096  # an operand this large ends the evaluation, so each ** stays cheap


class InvalidExpression(ValueError):
    """The expression has something `evaluate` (or the countdown's `parse_expression`) does not allow."""


def parse_expression(expr: str) -> ast.Expression:
    """A countdown answer's tree: integer literals with + - * / and parentheses only."""
    if len(expr) > _MAX_EXPR_CHARS:
        raise InvalidExpression(f"expression longer than {_MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise InvalidExpression(f"not an arithmetic expression: {err.msg}") from None
    for node in ast.walk(tree):
        allowed = isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, *_COUNTDOWN_OPS))
        allowed |= isinstance(node, ast.Constant) and type(node.value) is int
        if not allowed:
            raise InvalidExpression(f"{type(node).__name__} is not allowed (only + - * / and integers)")
    return tree


def literals(tree: ast.Expression) -> list[int]:
    """Integer literals in the expression (unary minus is an operator, not part of the number)."""
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)]


def evaluate(node: ast.AST) -> Fraction:
    """Exact value of numbers, unary + - and `_BINOPS` in parentheses. Raises InvalidExpression on anything
    else, a zero divisor, an exponent that is not an integer of at most MAX_EXPONENT, or a value over MAX_BITS."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = evaluate(node.left), evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT):
            raise InvalidExpression(f"exponents must be integers of at most {MAX_EXPONENT} in size")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise InvalidExpression("division by zero")
        value = Fraction(_BINOPS[type(node.op)](left, right))
        if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
            raise InvalidExpression(f"an intermediate value has more than {MAX_BITS} bits")
        return value
    raise InvalidExpression(f"unsupported element {ast.dump(node)[:60]}; use numbers, + - * / // % ** and "
                            f"parentheses")


def uses_numbers(used: list[int], available: list[int], number_use: str) -> bool:
    """`exactly_once`: the multisets are equal; `at_most_once`: `used` is a sub-multiset."""
    if number_use == "exactly_once":
        return Counter(used) == Counter(available)
    if number_use == "at_most_once":
        return not Counter(used) - Counter(available)
    raise ValueError(f"countdown number_use must be 'exactly_once' or 'at_most_once', got {number_use!r}")


def countdown_score(solution_str: str, ground_truth: Mapping, format_score: float = 0.1, score: float = 1.0,
                    number_use: str = "exactly_once") -> float:
    """`score` if the last `<answer>` expression (integers, + - * / and parentheses, evaluated exactly)
    uses the numbers as `number_use` says and equals `target`; as in TinyZero, any wrong tag earns
    `format_score`."""
    if not isinstance(ground_truth, Mapping) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(f"countdown ground_truth must be a dict with 'target' and 'numbers', got "
                         f"{ground_truth!r}")
    target = int(ground_truth["target"])
    numbers = [int(n) for n in ground_truth["numbers"]]  # parquet gives numpy arrays; normalise
    expr = extract_answer(solution_str)
    if expr is None:
        return 0.0
    try:
        tree = parse_expression(expr)
        if not uses_numbers(literals(tree), numbers, number_use):
            return format_score
        return score if evaluate(tree) == target else format_score
    except (InvalidExpression, RecursionError):
        return format_score


# only the tail is searched, as verl: the final answer sits at the end
_TAIL_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the answer string (commas and `$` removed) or None when no answer is found."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    # flexible: the last number that is not bare punctuation
    candidates = [c for c in _FLEXIBLE.findall(tail) if c not in ("", ".")]
    return candidates[-1].replace(",", "") if candidates else None


def gsm8k_score(solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0,
                score: float = 1.0) -> float:
    """`score` for a correct answer, `format_score` for a found but wrong one, 0.0 for none; `"strict"`
    reads only the dataset's `#### 42` marker, `"flexible"` the last number."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if answer == str(ground_truth).replace(",", "") else format_score


def last_boxed_only_string(text: str) -> str | None:
    """The last `\\boxed{...}` / `\\boxed ...` / `\\fbox{...}` in `text` with the command (nested braces
    kept whole), or None."""
    start = text.rfind("\\boxed")
    start = start if start >= 0 else text.rfind("\\fbox")
    if start < 0:
        return None
    if text.startswith("\\boxed ", start):
        # `\boxed 5`: the argument runs to the next `$` or the end
        return "\\boxed " + text[start + len("\\boxed ") :].split("$")[0].strip()
    depth = 0
    for pos in range(start, len(text)):
        if text[pos] == "{":
            depth += 1
        elif text[pos] == "}":
            depth -= 1
            if depth == 0:
                return text[start : pos + 1]
    return None  # unbalanced braces: no usable answer


def remove_boxed(boxed: str) -> str:
    """`\\boxed{x}` -> `x`, `\\boxed x` -> `x`, `\\fbox{x}` -> `x`."""
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed ") :]
    for prefix in ("\\boxed{", "\\fbox{"):
        if boxed.startswith(prefix) and boxed.endswith("}"):
            return boxed[len(prefix) : -1]
    raise ValueError(f"not a boxed expression: {boxed!r}")


def _fix_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}` -> `\\frac{1}{2}`: single-character arguments get braces."""
    pieces = s.split("\\frac")
    out = pieces[0]
    for piece in pieces[1:]:
        out += "\\frac"
        if piece.startswith("{") or len(piece) < 2:
            out += piece
            continue
        num, rest = piece[0], piece[1:]
        if rest.startswith("{"):
            out += "{" + num + "}" + rest
        else:
            out += "{" + num + "}{" + rest[0] + "}" + rest[1:]
    return out


def strip_string(s: str) -> str:
    """Normalise a MATH answer string so that equal answers written differently compare equal."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")  # degrees
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\text\{\s*[^{}]*\}\s*$", "", s) if re.search(r"\S\s*\\text\{", s) else s  # units
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    # "x = 5" -> "5" when the left side is a short variable name
    parts = s.split("=")
    if len(parts) == 2 and len(parts[0].strip()) <= 2:
        s = parts[1]
    s = re.sub(r"\\sqrt(?!\{)(\w)", r"\\sqrt{\1}", s)  # \sqrt3 -> \sqrt{3}
    s = _fix_fracs(s.replace(" ", ""))
    if s == "0.5":
        return "\\frac{1}{2}"
    fraction = re.fullmatch(r"(\d+)/(\d+)", s)  # 3/4 -> \frac{3}{4}
    return f"\\frac{{{fraction.group(1)}}}{{{fraction.group(2)}}}" if fraction else s


def is_equiv(str1: str | None, str2: str | None) -> bool:
    """MATH-paper equivalence: equal after `strip_string` (raw equality if normalisation fails)."""
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    try:
        return strip_string(str1) == strip_string(str2)
    except Exception:  # a malformed answer must not crash the scorer; fall back to raw equality
        return str1 == str2


def symbolic_equiv(answer: str, ground_truth: str) -> bool:
    """True when math_verify parses both boxed strings to equal SymPy objects."""
    from math_verify import parse, verify

    # math_verify's timeout uses SIGALRM, which works on the main thread only
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse("\\boxed{" + ground_truth + "}", parsing_timeout=timeout)
    pred = parse("\\boxed{" + answer + "}", parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def math_score(solution_str: str, ground_truth: str, use_math_verify: bool = True) -> float:
    """1.0 if the last boxed answer equals `ground_truth` as normalised strings (the MATH paper's, verl's
    `math` reward) or, on a mismatch, symbolically with `math_verify`; else 0.0."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    answer = remove_boxed(boxed)
    ground_truth = str(ground_truth)
    if is_equiv(answer, ground_truth):
        return 1.0
    return 1.0 if use_math_verify and symbolic_equiv(answer, ground_truth) else 0.0


_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)

_CALL_HARNESS = """

import json as _hrl_json, sys as _hrl_sys
_hrl_args = _hrl_json.loads(_hrl_sys.stdin.read())
_hrl_fn = Solution().{name} if "Solution" in globals() and hasattr(Solution, "{name}") else {name}
print(_hrl_json.dumps(_hrl_fn(*_hrl_args)))
"""


def _stdio_passed(result: SandboxResult, expected: Any) -> bool:
    expected = "\n".join(expected) if isinstance(expected, list) else str(expected)
    return result.status == "ok" and result.stdout.split() == expected.split()


def _call_passed(result: SandboxResult, expected: Any) -> bool:
    if result.status != "ok":
        return False
    try:
        got = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False
    # APPS wraps some expected return values in a one-element list.
    return got == expected or [got] == expected


def run_tests(code: str, tests: Mapping, limits: SandboxLimits | None = None) -> list[bool]:
    """Pass/fail of each test case, in order."""
    require_sandbox(limits)  # once per process: otherwise an unusable sandbox fails every case
    fn_name = tests.get("fn_name")
    if fn_name:
        program = code + _CALL_HARNESS.format(name=fn_name)
        jobs = [(program, json.dumps(list(args))) for args in tests["inputs"]]
    else:
        jobs = [(code, "\n".join(i) if isinstance(i, list) else str(i)) for i in tests["inputs"]]
    results = run_many(jobs, limits)
    check = _call_passed if fn_name else _stdio_passed
    return [check(r, expected) for r, expected in zip(results, tests["outputs"], strict=True)]


def code_score(solution_str: str, ground_truth: Any, continuous: bool = True,
               sandbox_limits: SandboxLimits | None = None) -> float:
    """Fraction of test cases passed (`continuous`) or 1.0/0.0 for all-or-nothing. `ground_truth`: APPS-style
    `inputs` and `outputs` (dict or JSON): stdin -> stdout compared token by token, or with `fn_name` the
    arguments of that function (or `Solution` method) -> its JSON return value. Raises
    SandboxUnavailableError, never scores, where the sandbox cannot run programs."""
    tests = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    if not isinstance(tests, Mapping) or "inputs" not in tests or "outputs" not in tests:
        raise ValueError("code ground_truth must be a dict (or JSON string) with 'inputs' and 'outputs' lists")
    if len(tests["inputs"]) != len(tests["outputs"]):
        raise ValueError(f"code ground_truth has {len(tests['inputs'])} inputs but {len(tests['outputs'])} outputs")
    if not tests["inputs"]:
        raise ValueError("code ground_truth has no test cases")
    blocks = _FENCE.findall(solution_str)  # the last fenced code block, else the whole response
    passed = run_tests(blocks[-1] if blocks else solution_str, tests, sandbox_limits)
    if continuous:
        return sum(passed) / len(passed)
    return 1.0 if all(passed) else 0.0


# data_source -> a key of SCORERS, as verl's `default_compute_score`, plus countdown and arithmetic
_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "countdown": "countdown",
    "arithmetic": "arithmetic",
    **dict.fromkeys(("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math"),
                    "math"),
    **dict.fromkeys(("codecontests", "apps", "codeforces", "taco", "likaixin/TACO-verified",
                     "deepmind/code_contests", "codeparrot/apps"), "code"),
}
# prefix families ("aime24"), checked after exact names
_PREFIXES: dict[str, str] = {"aime": "math", "math_": "math", "countdown": "countdown"}
SCORERS: dict[str, Callable[..., float]] = {"arithmetic": arithmetic_score, "countdown": countdown_score,
                                            "gsm8k": gsm8k_score, "math": math_score, "code": code_score}
# scorers that run programs: they get `sandbox_limits`, and `check_code_sandbox` probes for them
SANDBOX_SCORERS = frozenset({"code"})


class UnknownDataSourceError(RewardFunctionFatalError, NotImplementedError):
    """No built-in scorer for a data source: a setup error that stops the run (verl's NotImplementedError)."""


def scorer_name(data_source: str) -> str:
    """The key in `SCORERS` of the scorer of `data_source`."""
    if data_source in _SOURCES:
        return _SOURCES[data_source]
    for prefix, name in _PREFIXES.items():
        if data_source.startswith(prefix):
            return name
    known = sorted(_SOURCES) + [f"{prefix}*" for prefix in sorted(_PREFIXES)]
    raise UnknownDataSourceError(f"no built-in reward function for data_source={data_source!r}. Known "
                                 f"sources: {', '.join(known)}. For another source set "
                                 "custom_reward_function.path (and .name) to a file defining "
                                 "compute_score(data_source, solution_str, ground_truth, extra_info=None).")


def sandbox_sources(data_sources: Iterable[str]) -> list[str]:
    """The `data_sources` whose built-in scorer runs programs (unknown ones fail where they are scored)."""
    found = set()
    for source in set(data_sources):
        with contextlib.suppress(UnknownDataSourceError):
            if scorer_name(source) in SANDBOX_SCORERS:
                found.add(source)
    return sorted(found)


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                          extra_info: dict | None = None, sandbox_limits: SandboxLimits | None = None, **kwargs: Any) -> float | dict:
    """Score one response with its `data_source`'s scorer, which gets `kwargs` (`method="flexible"`) and,
    if it runs programs, `sandbox_limits`. Returns a float, or the scorer's dict unchanged."""
    name = scorer_name(data_source)
    if sandbox_limits is not None and name in SANDBOX_SCORERS:
        kwargs = {**kwargs, "sandbox_limits": sandbox_limits}
    result = SCORERS[name](solution_str, ground_truth, **kwargs)
    return result if isinstance(result, dict) else float(result)


def check_code_sandbox(data_sources: Iterable[object], limits: SandboxLimits) -> None:
    """Before any worker starts: raise SandboxUnavailableError when a data source's scorer runs programs and
    the sandbox cannot here; warn when it runs them in the weaker mode."""
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
