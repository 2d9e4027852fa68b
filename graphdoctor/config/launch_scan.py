"""Read the flags out of a Megatron-LM launch line or `@file` (a flag list, a torchrun line or a whole shell
script): `\\` continuations, `#` comments, the variables and arrays the text sets, bounded expansion, and
where each flag stands. What the flags mean is graphdoctor.rules.megatron_args.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphdoctor.config.schema import check_plain_values
from graphdoctor.errors import InputFileError, UsageError
from graphdoctor.inputs import describe, describe_error, read_text


@dataclass(frozen=True, slots=True)
class FlagUse:
    """One `--flag [values]` of the launch line, after shell variables were expanded."""

    flag: str
    values: tuple[str, ...]
    """The tokens after the flag up to the next flag or the end of its command (resolved)."""
    where: str | None
    """`path:line` for @file input, else None."""
    launcher: bool = False
    """Given to the launcher (torchrun, python) before the training script, not to the script."""
    unresolved: tuple[str, ...] = ()
    """`$VAR` references among the values that the text does not set (left out of `values`)."""
    script: str | None = None
    """The script its command runs (`pretrain_gpt.py`, or the module of `python -m pkg.mod`), None without one."""


_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "then", "do", "else", "{", "}"})
_KEYWORDS = frozenset({"export", "local", "declare", "readonly", "if", "elif", "while", "fi", "done", "!"})
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_REF = re.compile(r"\$(?:\{([A-Za-z_]\w*)(?:(:?-)([^}]*))?\}|([A-Za-z_]\w*))")
_ARRAY_REF = re.compile(r"^\$\{([A-Za-z_]\w*)\[[@*]\]\}$")
_REDIRECT = re.compile(r"^\d*(>>?|<)(&\d+)?")
_Token = tuple[str, str | None]


def _physical_lines(text: str, label: str | None) -> list[list[_Token]]:
    """Logical lines (backslash continuations joined) as (token, `label:line`) lists; a quoted
    string may span lines (the old `GPT_ARGS="--num-layers 24 \\ ..."` scripts)."""
    out: list[list[_Token]] = []
    current: list[_Token] = []
    pending: list[str] = []
    lines = text.splitlines()
    for number, raw in enumerate(lines, start=1):
        if not pending and raw.lstrip().startswith("#"):
            continue  # a comment line never continues, even when it ends in a backslash
        # a line continuation may be followed by a comment: `--flag \\  # note`
        cont = re.search(r"\\\s*(#.*)?$", raw)
        pending.append(raw[:cont.start()] if cont else raw)
        try:
            tokens = shlex.split(" ".join(pending), comments=True)
        except ValueError as exc:
            if "closing quotation" in str(exc) and number < len(lines):
                continue
            where = f"{label}:{number}" if label else "the launch line"
            raise (InputFileError if label else UsageError)(
                f"{where}: cannot split ({describe_error(exc)})") from None
        first = number - len(pending) + 1
        pending = []
        current.extend((t, f"{label}:{first}" if label else None) for t in tokens)
        if not cont:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


@dataclass(slots=True)
class _Shell:
    """What the scan of a launch script knows: variables set in it (values with locations)."""

    variables: dict[str, list[_Token]] = field(default_factory=dict)
    array: str | None = None
    """The array being defined (`NAME=(` seen, `)` not yet)."""
    commands: list[list[_Token]] = field(default_factory=list)
    exported: list[str] = field(default_factory=list)
    """Variables the text exports (`export NAME=value`): the run's environment."""

    def expand(self, token: str) -> tuple[str | None, str | None]:
        """(value, None) with every $reference set in the text, else (None, the reference)."""
        missing: list[str] = []
        size = [len(token)]

        def sub(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(4)
            if name in self.variables:
                text = " ".join(t for t, _ in self.variables[name])
                size[0] += len(text)
                if size[0] <= MAX_EXPANDED_CHARS:
                    return text
            elif match.group(2):
                return match.group(3)
            missing.append(match.group(0))  # unset, or a value that doubles itself past the cap
            return ""

        value = _REF.sub(sub, token)
        if missing or "$(" in token or "`" in token or re.search(r"\$\{?[0-9@*#?]", token):
            return None, token
        return value, None


MAX_EXPANDED_CHARS = 1 << 16
"""Longest word a variable expansion may build (`A="$A$A"` repeated doubles; real values are paths)."""
MAX_EXPANDED_WORDS = 1 << 18
"""Most words the commands of a launch script may expand to (arrays used many times multiply)."""


def _statement(tokens: list[_Token], shell: _Shell) -> None:
    """One logical line: array elements, assignments, or commands (split at ; && | ...)."""
    command: list[_Token] = []
    for token, where in tokens:
        if shell.array is not None:
            closes = token == ")" or (token.endswith(")") and token.count(")") > token.count("("))
            text = token[:-1] if closes else token
            spliced = _ARRAY_REF.fullmatch(text.strip('"'))
            if spliced and spliced.group(1) in shell.variables:  # A+=("${B[@]}"): B's elements, as bash copies them
                shell.variables[shell.array].extend(shell.variables[spliced.group(1)])
            elif text:
                shell.variables[shell.array].append((text, where))
            if closes:
                shell.array = None
            continue
        bare = token.rstrip(";&") if token not in _SEPARATORS else token
        if not command or all(t in _KEYWORDS for t, _ in command):
            match = _ASSIGN.match(token)
            if match and not token.startswith("-"):
                _assign(match, where, shell)
                if any(t == "export" for t, _ in command) and match.group(1) not in shell.exported:
                    shell.exported.append(match.group(1))
                continue
        if token in _SEPARATORS or bare != token:
            if bare != token and bare:
                command.append((bare, where))
            shell.commands.append(command)
            command = []
            continue
        command.append((token, where))
    if command:
        shell.commands.append(command)


def _assign(match: re.Match[str], where: str | None, shell: _Shell) -> None:
    name, append, value = match.group(1), match.group(2), match.group(3)
    if value.startswith("("):
        shell.array = name
        if not append or name not in shell.variables:
            shell.variables[name] = []
        rest = value[1:]
        if rest:
            _statement([(rest, where)], shell)
        return
    resolved, _ = shell.expand(value)
    if resolved is None:
        shell.variables.pop(name, None)
    else:
        shell.variables[name] = [(resolved, where)]


def _expand_command(command: list[_Token], shell: _Shell, budget: int) -> list[tuple[str, str | None, str | None]]:
    """(token, where, unresolved reference) with arrays and unquoted whole-word variables spliced in;
    stops once more than `budget` words came out (the caller refuses the text)."""
    out: list[tuple[str, str | None, str | None]] = []
    skip_next = False
    for token, where in command:
        if len(out) > budget:
            break
        if skip_next:
            skip_next = False
            continue
        if _REDIRECT.match(token):
            skip_next = token in (">", ">>", "<", "2>", "1>")
            continue
        array = _ARRAY_REF.match(token)
        name = array.group(1) if array else None
        plain = _REF.fullmatch(token)
        if plain and not plain.group(2):
            name = plain.group(1) or plain.group(4)
        if name is not None and name in shell.variables:
            elements = shell.variables[name]
            for value, at in elements:
                if array:  # array elements are expanded where they are used, then split as bash splits them
                    expanded, gap = shell.expand(value)
                    if gap or expanded is None:
                        out.append(("", at, gap))
                    else:  # unquoted ${A[@]}: "--fp8-format hybrid" is two words (Megatron-LM's llama script)
                        out.extend((word, at, None) for word in (expanded.split() or [""]))
                    continue
                # bash splits an unquoted scalar on whitespace (GPT_ARGS="--num-layers 24 ...")
                out.extend((p, at, None) for p in (value.split() if plain else [value]))
            continue
        if array:
            out.append(("", where, token))
            continue
        expanded, missing = shell.expand(token)
        out.append((expanded if expanded is not None else "", where, missing))
    return out


def scan_launch_line(text_or_at: str) -> list[FlagUse]:
    """The flags of a launch line or `@file` (scan_launch)."""
    return scan_launch(text_or_at)[0]


def scan_launch(text_or_at: str) -> tuple[list[FlagUse], dict[str, str]]:
    """The flags of a launch line or `@file` (a flag list, a torchrun line or a whole shell script), and the
    environment variables it exports with values it sets (`export CUDA_DEVICE_MAX_CONNECTIONS=1`).

    Shell variables the text sets (`NAME=value`, arrays `NAME=(...)`, `${NAME:-default}`) are
    expanded; `$1`, `$(...)` and variables it does not set stay unresolved. When a command runs a
    `.py` script, only such commands count: flags before the script are the launcher's.

    Raises:
        UsageError: an inline line that cannot be split.
        InputFileError: an unreadable @file or one that cannot be split.
    """
    label: str | None = None
    text = text_or_at
    if text_or_at.startswith("@"):
        label = text_or_at[1:]
        text = read_text(Path(label), "--megatron-args file")
    shell = _Shell()
    for line in _physical_lines(text, label):
        _statement(line, shell)
    commands: list[list[tuple[str, str | None, str | None]]] = []
    budget = MAX_EXPANDED_WORDS
    for words in shell.commands:
        commands.append(_expand_command(words, shell, budget))
        budget -= len(commands[-1])
        if budget < 0:
            raise (InputFileError if label else UsageError)(
                f"{label or 'the launch line'}: expands to more than {MAX_EXPANDED_WORDS} words "
                f"(arrays used many times?)")
    scripts = [c for c in commands if _script_at(c) >= 0]
    training = [c for c in scripts if any(re.search(r"train[^/]*\.py$", t) for t, _, _ in c)]
    uses: list[FlagUse] = []
    for command in training or scripts or commands:
        uses.extend(_flag_uses(command))
    env = {name: " ".join(t for t, _ in shell.variables[name]) for name in shell.exported if name in shell.variables}
    return uses, env


_FLAG = re.compile(r"^--[A-Za-z0-9][\w.-]*(=.*)?$", re.S)
"""A flag word (a `case` pattern such as `--nproc)` is none)."""


def _script_at(command: list[tuple[str, str | None, str | None]]) -> int:
    """The index of the script a command runs (`x.py`, or the module after `-m`), -1 without one."""
    for i, (token, _, _) in enumerate(command):
        if token.endswith(".py") or (i > 0 and command[i - 1][0] == "-m" and not token.startswith("-")):
            return i
    return -1


def _flag_uses(command: list[tuple[str, str | None, str | None]]) -> list[FlagUse]:
    script = _script_at(command)
    name = command[script][0].rsplit("/", 1)[-1] if script >= 0 else None
    uses: list[FlagUse] = []
    i = 0
    while i < len(command):
        at = i
        token, where, missing = command[i]
        i += 1
        if not _FLAG.match(token):
            continue
        flag, eq, inline = token.partition("=")
        values: list[str] = [inline] if eq and not missing else []
        unresolved: list[str] = [missing] if eq and missing else []
        while not eq and i < len(command) and i != script and not command[i][0].startswith("--") \
                and not (command[i][0] == "-m" and i + 1 == script):
            value, _, gap = command[i]
            if gap:
                unresolved.append(gap)
            else:
                values.append(value)
            i += 1
        uses.append(FlagUse(flag, tuple(values), where, launcher=at < script, unresolved=tuple(unresolved),
                            script=name))
    return uses


MAX_MOE_PATTERN_CHARS = 1000
"""Longest --moe-layer-freq expression accepted (Megatron's are a few dozen characters)."""
MAX_MOE_PATTERN_LAYERS = 100_000
"""Longest --moe-layer-freq pattern list accepted (one entry per layer)."""


def parse_moe_layer_freq(text: str) -> int | list[int]:
    """Megatron's moe_layer_freq: an int, or a Python-list expression such as `([1]*3+[0]*1)*3`.

    Evaluated by a bounded evaluator of the forms Megatron documents (int literals, list
    literals of ints, `+` of two lists, `*` of a list and an int, parentheses), never by eval:
    the result length is computed before a list is built and capped at MAX_MOE_PATTERN_LAYERS.

    Raises:
        UsageError: anything else, or a pattern too long.
    """
    expected = "an int or a list pattern like ([1]*3+[0]*1)*3"
    if len(text) > MAX_MOE_PATTERN_CHARS:
        raise UsageError(f"--moe-layer-freq: got {len(text)} characters, expected {expected} "
                         f"under {MAX_MOE_PATTERN_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
        return _moe_value(tree, text, expected)
    except UsageError:
        raise
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise UsageError(f"--moe-layer-freq: got {describe(text)}, expected {expected}") from None


def _moe_value(node: ast.AST, text: str, expected: str) -> int | list[int]:
    def fail(why: str = "") -> UsageError:
        return UsageError(f"--moe-layer-freq: got {describe(text)}, expected {expected}{why}")

    if isinstance(node, ast.Constant) and type(node.value) is int:
        if not 0 <= node.value <= MAX_MOE_PATTERN_LAYERS:
            raise fail(f" (an int between 0 and {MAX_MOE_PATTERN_LAYERS})")
        return node.value
    if isinstance(node, ast.List):
        items = [_moe_value(e, text, expected) for e in node.elts]
        if not all(type(i) is int for i in items):
            raise fail(" (a flat list of ints)")
        return items  # type: ignore[return-value]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        left, right = _moe_value(node.left, text, expected), _moe_value(node.right, text, expected)
        if isinstance(node.op, ast.Add):
            if not (isinstance(left, list) and isinstance(right, list)):
                raise fail(" (+ joins two lists)")
            length = len(left) + len(right)
        else:
            if isinstance(left, list) == isinstance(right, list):
                raise fail(" (* repeats a list an int number of times)")
            times = right if isinstance(left, list) else left
            seq = left if isinstance(left, list) else right
            assert isinstance(times, int) and isinstance(seq, list)
            length = len(seq) * max(times, 0)
        if length > MAX_MOE_PATTERN_LAYERS:
            raise fail(f" (at most {MAX_MOE_PATTERN_LAYERS} layers, got {length})")
        return left + right if isinstance(node.op, ast.Add) else left * right  # type: ignore[operator,no-any-return]
    raise fail()


def convert_value(flag: str, kind: str, values: list[str]) -> Any:
    """A flag value of `kind` (int, float, freq, list, list3, str), plain-checked.

    Raises:
        UsageError: a value of the wrong type.
    """
    if kind == "freq":
        return parse_moe_layer_freq(values[0])
    try:
        if kind == "int":
            number: int | float = int(values[0])
        elif kind == "float":
            number = float(values[0])
        else:
            number = 0
        check_plain_values(number, flag)
        if kind in ("int", "float"):
            return number
    except ValueError:
        raise UsageError(f"{flag}: got {describe(values[0])}, expected "
                         f"{'an integer' if kind == 'int' else 'a finite number'}") from None
    if kind in ("list", "list3"):
        return list(values)
    return values[0]


def unresolved_note(uses: list[FlagUse]) -> str | None:
    """The one note naming the flags whose value is a shell variable the text does not set."""
    skipped = [f"{u.flag} {u.unresolved[0]}" for u in uses if u.unresolved and not u.values]
    if not skipped:
        return None
    return ("values that are shell variables the text does not set were skipped (the flag is left "
            "out): " + ", ".join(skipped))



__all__ = ["MAX_EXPANDED_CHARS", "MAX_EXPANDED_WORDS", "MAX_MOE_PATTERN_CHARS", "MAX_MOE_PATTERN_LAYERS", "FlagUse",
           "convert_value", "parse_moe_layer_freq", "scan_launch", "scan_launch_line", "unresolved_note"]
