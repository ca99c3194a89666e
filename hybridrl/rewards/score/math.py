"""MATH scorer: last `\\boxed{}` answer, MATH-paper string equivalence, then symbolic equivalence.

Extraction and normalisation follow Hendrycks et al. 2021, "Measuring Mathematical Problem Solving
With the MATH Dataset" (the `is_equiv` used by verl's `math` reward): the answer is the argument of the
last `\\boxed{...}` (or `\\fbox{...}`); both strings are normalised (units, `\\left`/`\\right`, `dfrac`,
`0.5` -> `\\frac{1}{2}`, ...) and compared as strings. Because string equality misses `1,000` vs
`1000` or `\\frac{2}{4}` vs `0.5`, a string mismatch falls back to `math_verify` (Hugging Face's
parser + SymPy comparison).
"""

from __future__ import annotations

import re
import threading


def last_boxed_only_string(text: str) -> str | None:
    """The last `\\boxed{...}` / `\\boxed ...` / `\\fbox{...}` in `text` including the command, or None.

    Braces are matched by depth counting, so nested `\\frac{1}{2}` inside the box stays whole.
    """
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    if text.startswith("\\boxed ", start):
        # `\boxed 5` form: the argument runs to the next `$` (inline math end) or the end.
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
    for prefix in ("\\boxed ",):
        if boxed.startswith(prefix):
            return boxed[len(prefix) :]
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


def _fix_slash_fraction(s: str) -> str:
    """`3/4` (two plain integers) -> `\\frac{3}{4}`."""
    match = re.fullmatch(r"(\d+)/(\d+)", s)
    return f"\\frac{{{match.group(1)}}}{{{match.group(2)}}}" if match else s


def _fix_sqrt(s: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}` (one-character argument)."""
    return re.sub(r"\\sqrt(?!\{)(\w)", r"\\sqrt{\1}", s)


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
    # "x = 5" -> "5" when the left side is a short variable name.
    parts = s.split("=")
    if len(parts) == 2 and len(parts[0].strip()) <= 2:
        s = parts[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash_fraction(s)


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

    # math_verify bounds its own work with SIGALRM, which only works on the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse("\\boxed{" + ground_truth + "}", parsing_timeout=timeout)
    pred = parse("\\boxed{" + answer + "}", parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def compute_score(solution_str: str, ground_truth: str, use_math_verify: bool = True) -> float:
    """1.0 if the last boxed answer equals `ground_truth` (string or symbolic), else 0.0."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    answer = remove_boxed(boxed)
    ground_truth = str(ground_truth)
    if is_equiv(answer, ground_truth):
        return 1.0
    return 1.0 if use_math_verify and symbolic_equiv(answer, ground_truth) else 0.0
