"""The arguments of a Megatron-LM launch script, read without running it.

Megatron-LM's example scripts (examples/gpt3/train_gpt3_175b_distributed.sh,
examples/llama/train_llama3_8b_h100_fp8.sh) set variables and bash arrays, test them in
`if [[ ... ]]` blocks and end in `torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${...[@]}`. This
reads that subset of bash: assignments (`NAME=value`, `export NAME=value`, `NAME=( ... )`,
`NAME+=( ... )`), `$NAME`, `${NAME}`, `${NAME:-default}`, `${NAME[@]}`, `$(( arithmetic ))`,
`if/elif/else/fi` on `[[ "$A" == "b" ]]`, `!=`, `-z`, `-n`, negated with `!`, joined by `||` /
`&&`, and the launch line. File tests (`[ ! -f "$PRETRAIN_SCRIPT_PATH" ]`, `-d`, `-e`) are about the
machine the job ran on, which the reader cannot see: they count as true (the path exists), so the
scripts' guards that stop when a file is missing do not stop it. A variable neither set in the script nor in the environment (`$1`, `$(command)`) stays
unexpanded, and is an error only where its value is needed.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from chameleon_opt.errors import InputError

UNSET = "\x00"
"""Marks an unexpanded variable inside a word: UNSET + name + UNSET."""

_ASSIGN = re.compile(r"^(?:export\s+|declare\s+(?:-\w+\s+)?|local\s+)?([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_VAR = re.compile(r"\$\(\((.*?)\)\)|\$\{([A-Za-z_]\w*)\[[@*]\]\}|\$\{([A-Za-z_]\w*)(?::?[-=]([^}]*))?\}"
                  r"|\$([A-Za-z_]\w*|\d|@|\*|#)|\$\(([^)]*)\)|`([^`]*)`")
_FILE_TESTS = ("-f", "-d", "-e", "-r", "-s", "-x", "-w")
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class LaunchLine:
    """What the script runs: the launcher's arguments, the training script and its arguments."""

    launcher: list[str]
    program: str
    arguments: list[str]


def unset_name(word: str) -> str | None:
    """The first unexpanded variable in a word, or None."""
    if UNSET not in word:
        return None
    return word.split(UNSET)[1]


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # that starts a word outside quotes)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _statements(text: str) -> list[tuple[int, str]]:
    """Logical statements with their line numbers: continuations joined, comments dropped, an
    array assignment gathered up to its closing parenthesis, `;`-separated `then` split off."""
    lines: list[tuple[int, str]] = []
    continued = ""
    for number, raw in enumerate(text.split("\n"), 1):
        if raw.endswith("\\"):
            continued += raw[:-1] + " "
            continue
        lines.append((number, continued + raw))
        continued = ""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in lines:
        line = _strip_comment(raw).strip()
        if pending:
            pending += " " + line
            if pending.count("(") <= pending.count(")"):
                out.append((start, pending))
                pending = ""
            continue
        if not line:
            continue
        if re.match(r"^(?:export\s+)?[A-Za-z_]\w*\+?=\(", line) and line.count("(") > line.count(")"):
            pending, start = line, number
            continue
        for part in re.split(r";\s*(?=then\b|do\b|fi\b|else\b)", line):
            out.append((number, part.strip()))
    return out


class _Script:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.scalars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}

    def value(self, name: str) -> str | None:
        if name in self.arrays:
            return shlex.join(self.arrays[name])
        if name in self.scalars:
            return self.scalars[name]
        return os.environ.get(name)

    def expand(self, text: str, line: int) -> str:
        """Variables and arithmetic substituted; an unknown variable becomes a marked word."""
        def substitute(match: re.Match[str]) -> str:
            arithmetic, array, name, default, bare, command, backtick = match.groups()
            if arithmetic is not None:
                expression = self.expand(re.sub(r"\b([A-Za-z_]\w*)\b", r"$\1", arithmetic.replace("$", "")), line)
                if UNSET in expression or not re.fullmatch(r"[\d\s+\-*/%()]+", expression):
                    return f"{UNSET}$(({arithmetic})){UNSET}"
                return str(int(eval(expression.replace("/", "//"), {"__builtins__": {}})))  # digits and operators
            if array is not None:  # unquoted: the elements are split again at whitespace, as bash does
                return " ".join(self.arrays[array]) if array in self.arrays else f"{UNSET}{array}{UNSET}"
            if command is not None or backtick is not None:
                return f"{UNSET}$({command if command is not None else backtick}){UNSET}"
            key = name or bare
            found = self.value(key)
            if found is None and default is not None:
                found = self.expand(default, line)
            return found if found is not None else f"{UNSET}{key}{UNSET}"
        return _VAR.sub(substitute, text)

    def words(self, text: str, line: int) -> list[str]:
        # "${A[@]}": one word per element ("--vocab-size 128256" stays one word, as bash passes it)
        text = re.sub(r'"\$\{(\w+)\[@\]\}"',
                      lambda m: shlex.join(self.arrays[m[1]]) if m[1] in self.arrays else m[0], text)
        try:
            return shlex.split(self.expand(text, line))
        except ValueError as err:
            raise InputError(self.path, f"line {line}", f"cannot be read ({err})", "fix the quoting") from None

    def condition(self, text: str, line: int) -> bool:
        """`[[ a == b ]]`, `!=`, `-z`, `-n`, file tests (true), each negated by `!`, joined by `||`
        and `&&` (left to right)."""
        words = self.words(text, line)
        result, joiner, i = None, None, 0
        while i < len(words):
            if words[i] in ("||", "&&"):
                joiner, i = words[i], i + 1
                continue
            negate = words[i] == "!"
            i += negate
            if i >= len(words) or words[i] not in ("[[", "["):
                raise InputError(self.path, f"line {line}", f"condition {text!r} is not a [[ ... ]] test",
                                 "pass the Megatron-LM arguments directly instead of the script")
            close = next((j for j in range(i, len(words)) if words[j] in ("]]", "]")), len(words))
            test = words[i + 1:close]
            if test[:1] == ["!"]:
                negate, test = not negate, test[1:]
            if len(test) == 2 and test[0] in _FILE_TESTS:
                value = True  # the job ran, so the paths its script checks existed
            elif any(UNSET in w for w in test):
                raise InputError(self.path, f"line {line}", f"condition {text!r} depends on ${unset_name(''.join(test))}",
                                 "define it in the script or the environment")
            elif len(test) == 3 and test[1] in ("==", "=", "!="):
                value = (test[0] == test[2]) == (test[1] != "!=")
            elif len(test) in (1, 2) and test[0] in ("-z", "-n"):
                empty = len(test) == 1 or test[1] == ""
                value = empty if test[0] == "-z" else not empty
            else:
                raise InputError(self.path, f"line {line}", f"condition {text!r} is not ==, !=, -z, -n or a "
                                 "file test", "pass the Megatron-LM arguments directly instead of the script")
            value = value != negate
            result = value if result is None else (result or value) if joiner == "||" else (result and value)
            i = close + 1
        return bool(result)


def read_launch_script(path: Path) -> LaunchLine:
    """The launcher's and the training script's arguments of a bash launch script."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(path, "file", f"cannot be read ({type(err).__name__})", "give a launch script") from None
    script = _Script(path)
    active = [True]   # is each enclosing if-branch running
    taken = [True]    # has a branch of each enclosing if already run
    launch: LaunchLine | None = None
    for line, statement in _statements(text):
        head = statement.split(None, 1)[0] if statement else ""
        rest = statement[len(head):].strip()
        if head == "if":
            running = active[-1] and script.condition(re.sub(r";?\s*then$", "", rest), line)
            active.append(running)
            taken.append(running or not active[-2])
            continue
        if head == "elif":
            running = not taken[-1] and active[-2] and script.condition(re.sub(r";?\s*then$", "", rest), line)
            active[-1] = running
            taken[-1] = taken[-1] or running
            continue
        if head == "else":
            active[-1] = not taken[-1] and active[-2]
            taken[-1] = True
            continue
        if head == "fi":
            if len(active) == 1:
                raise InputError(path, f"line {line}", "fi without if", "fix the script")
            active.pop()
            taken.pop()
            continue
        if head in ("then", "") or not active[-1]:
            continue
        match = _ASSIGN.match(statement)
        if match:
            name, append, value = match.groups()
            if value.startswith("("):
                words = script.words(value.strip()[1:-1], line)
                script.arrays[name] = (script.arrays.get(name, []) if append else []) + words
            else:
                words = script.words(value, line) if value.strip() else [""]
                joined = " ".join(words)
                script.scalars[name] = (script.scalars.get(name, "") if append else "") + joined
            continue
        words = script.words(statement, line)
        found = _launch(words)
        if found is not None:
            launch = found
    if len(active) != 1:
        raise InputError(path, "if", "not closed by fi", "fix the script")
    if launch is None:
        raise InputError(path, "<script>", "no launch line (torchrun ... pretrain_*.py, or python ... .py)",
                         "give the script that starts training, or its arguments")
    return launch


def _launch(words: list[str]) -> LaunchLine | None:
    """A torchrun / python line's launcher and script arguments, or None for another command."""
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script is None or not words:
        return None
    command = os.path.basename(words[0])
    if command == "torchrun":
        return LaunchLine(words[1:script], words[script], words[script + 1:])
    if command.startswith("python"):
        if "-m" in words[:script] and any(w in _LAUNCHERS for w in words[:script]):
            start = next(i for i, w in enumerate(words) if w in _LAUNCHERS) + 1
            return LaunchLine(words[start:script], words[script], words[script + 1:])
        return LaunchLine([], words[script], words[script + 1:])
    return None
