"""The Dockerfile read as data, for the container tests (tests/deploy/): the image it describes (base, ENV, WORKDIR,
the COPY and RUN steps in order, USER, HEALTHCHECK, ENTRYPOINT, CMD) and the build context's .dockerignore.

Strict on purpose: an instruction, a flag or a form this reader does not know raises :class:`DockerfileError` naming
the line, so that a change to the Dockerfile cannot slip past the fallback that replays its steps in a virtual
environment (where no container engine can run) with steps silently left out. Teach it the new form instead.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

KNOWN = frozenset({"FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "VOLUME", "EXPOSE", "HEALTHCHECK",
                   "ENTRYPOINT", "CMD"})
HEALTHCHECK_FLAGS = frozenset({"interval", "timeout", "start-period", "start-interval", "retries"})
_DIRECTIVE = re.compile(r"^#\s*(syntax|escape|check)\s*=", re.IGNORECASE)
_FLAG = re.compile(r"^--([a-z-]+)=(\S+)$")
_OPERATOR = re.compile(r"^[();<>|&]+$")


class DockerfileError(ValueError):
    """Raised when the Dockerfile (or .dockerignore) holds an instruction, flag or form this reader does not know."""


@dataclass(frozen=True)
class Instruction:
    """One instruction, continuation lines joined: its keyword (upper case), its leading ``--name=value`` flags,
    the rest, and the line it starts on."""

    keyword: str
    flags: Mapping[str, str]
    value: str
    line: int


@dataclass(frozen=True)
class Copy:
    """``COPY SOURCES... DEST``: sources relative to the build context, ``dest`` absolute in the image."""

    sources: tuple[str, ...]
    dest: str
    into_directory: bool
    """DEST names a directory the sources go into (it ends with "/", or there are several sources)."""


@dataclass(frozen=True)
class Run:
    """``RUN a && b && ...`` (shell form): each command's words, the ENV and WORKDIR it runs with."""

    commands: tuple[tuple[str, ...], ...]
    env: Mapping[str, str]
    workdir: str


@dataclass(frozen=True)
class HealthCheck:
    options: Mapping[str, str]
    command: tuple[str, ...]
    """The command's argv: exec form as written, shell form as ``/bin/sh -c TEXT`` (as the engine runs it)."""


@dataclass(frozen=True)
class Image:
    base: str
    steps: tuple[Copy | Run, ...]
    env: Mapping[str, str]
    workdir: str
    user: str | None
    volumes: tuple[str, ...]
    exposed: tuple[str, ...]
    healthcheck: HealthCheck | None
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]

    @property
    def argv(self) -> tuple[str, ...]:
        """What the container runs: ENTRYPOINT, then CMD."""
        return self.entrypoint + self.cmd


def instructions(text: str) -> list[Instruction]:
    """The instructions, in order: comments and blank lines dropped (also inside continuations, as the engines do),
    a trailing backslash joining the next line. Parser directives and heredocs are refused: both change parsing."""
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not found and not pending and _DIRECTIVE.match(stripped):
            raise DockerfileError(f"line {number}: parser directive {stripped!r} is not supported")
        if not stripped or stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        found.append(_instruction(" ".join(pending), start))
        pending = []
    if pending:
        raise DockerfileError(f"line {start}: the last instruction ends with a continuation backslash")
    return found


def _instruction(text: str, line: int) -> Instruction:
    keyword, _, rest = text.partition(" ")
    keyword = keyword.upper()
    if keyword not in KNOWN:
        raise DockerfileError(f"line {line}: instruction {keyword} is not known to tests/support/dockerfile.py")
    if "<<" in rest:
        raise DockerfileError(f"line {line}: heredocs ({keyword} <<...) are not supported")
    flags: dict[str, str] = {}
    words = rest.strip().split(" ")
    while words and words[0].startswith("--"):
        word = words.pop(0)
        match = _FLAG.match(word)
        if match is None:
            raise DockerfileError(f"line {line}: {keyword} flag {word!r} is not --name=value")
        flags[match.group(1)] = match.group(2)
    return Instruction(keyword, flags, " ".join(words).strip(), line)


@dataclass
class _Reading:
    base: str | None = None
    steps: list[Copy | Run] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str | None = None
    volumes: list[str] = field(default_factory=list)
    exposed: list[str] = field(default_factory=list)
    healthcheck: HealthCheck | None = None
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


def read_image(path: Path) -> Image:
    """The image the Dockerfile at ``path`` describes (one stage)."""
    reading = _Reading()
    for instruction in instructions(path.read_text()):
        if instruction.keyword != "HEALTHCHECK" and instruction.flags:
            raise DockerfileError(f"line {instruction.line}: {instruction.keyword} flags {dict(instruction.flags)} "
                                  f"are not supported")
        if instruction.keyword != "FROM" and reading.base is None:
            raise DockerfileError(f"line {instruction.line}: {instruction.keyword} before FROM")
        _READERS[instruction.keyword](reading, instruction)
    if reading.base is None:
        raise DockerfileError("no FROM")
    return Image(reading.base, tuple(reading.steps), dict(reading.env), reading.workdir, reading.user,
                 tuple(reading.volumes), tuple(reading.exposed), reading.healthcheck, reading.entrypoint, reading.cmd)


def _literal(instruction: Instruction, text: str) -> str:
    """``text``, refused if the engine would expand a variable in it (this reader does not)."""
    if "$" in text:
        raise DockerfileError(f"line {instruction.line}: variables ({text!r}) in {instruction.keyword} are not "
                              f"supported")
    return text


def _from(reading: _Reading, instruction: Instruction) -> None:
    words = instruction.value.split()
    if reading.base is not None:
        raise DockerfileError(f"line {instruction.line}: a second FROM (multi-stage builds are not supported)")
    if len(words) != 1:
        raise DockerfileError(f"line {instruction.line}: FROM {instruction.value!r}: only FROM IMAGE is supported")
    reading.base = _literal(instruction, words[0])


def _env(reading: _Reading, instruction: Instruction) -> None:
    for pair in shlex.split(instruction.value):
        name, equals, value = pair.partition("=")
        if not equals:
            raise DockerfileError(f"line {instruction.line}: ENV {pair!r}: only the NAME=VALUE form is supported")
        reading.env[name] = _literal(instruction, value)


def _absolute(reading: _Reading, path: str) -> str:
    return str(PurePosixPath(reading.workdir, path))


def _workdir(reading: _Reading, instruction: Instruction) -> None:
    reading.workdir = _absolute(reading, _literal(instruction, instruction.value))


def _copy(reading: _Reading, instruction: Instruction) -> None:
    if instruction.value.startswith("["):
        raise DockerfileError(f"line {instruction.line}: the JSON form of COPY is not supported")
    words = [_literal(instruction, word) for word in shlex.split(instruction.value)]
    if len(words) < 2:
        raise DockerfileError(f"line {instruction.line}: COPY needs a source and a destination")
    *sources, dest = words
    for source in sources:
        if any(char in source for char in "*?[") or PurePosixPath(source).is_absolute() or ".." in source.split("/"):
            raise DockerfileError(f"line {instruction.line}: COPY source {source!r}: only plain paths inside the "
                                  f"build context are supported")
    into = dest.endswith("/") or dest in (".", "..") or len(sources) > 1
    reading.steps.append(Copy(tuple(sources), _absolute(reading, dest), into))


def _run(reading: _Reading, instruction: Instruction) -> None:
    if instruction.value.startswith("["):
        raise DockerfileError(f"line {instruction.line}: the exec form of RUN is not supported")
    lexer = shlex.shlex(instruction.value, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[tuple[str, ...]] = [()]
    for word in lexer:
        if word == "&&":
            commands.append(())
        elif _OPERATOR.match(word) or "$" in word or "`" in word:
            raise DockerfileError(f"line {instruction.line}: RUN {word!r}: only commands joined by && are supported "
                                  f"(no other operators, redirections or expansions)")
        else:
            commands[-1] += (word,)
    if not all(commands):
        raise DockerfileError(f"line {instruction.line}: RUN has an empty command")
    reading.steps.append(Run(tuple(commands), dict(reading.env), reading.workdir))


def _user(reading: _Reading, instruction: Instruction) -> None:
    reading.user = _literal(instruction, instruction.value)


def _volume(reading: _Reading, instruction: Instruction) -> None:
    reading.volumes += _json_words(instruction) if instruction.value.startswith("[") else instruction.value.split()


def _expose(reading: _Reading, instruction: Instruction) -> None:
    reading.exposed += instruction.value.split()


def _healthcheck(reading: _Reading, instruction: Instruction) -> None:
    unknown = set(instruction.flags) - HEALTHCHECK_FLAGS
    if unknown:
        raise DockerfileError(f"line {instruction.line}: HEALTHCHECK flags {sorted(unknown)} are not known")
    if instruction.value.upper() == "NONE":
        reading.healthcheck = None
        return
    keyword, _, rest = instruction.value.partition(" ")
    if keyword.upper() != "CMD":
        raise DockerfileError(f"line {instruction.line}: HEALTHCHECK {keyword}: only CMD or NONE")
    rest = rest.strip()
    command = tuple(_json_words(instruction, rest)) if rest.startswith("[") else ("/bin/sh", "-c", rest)
    reading.healthcheck = HealthCheck(dict(instruction.flags), command)


def _entrypoint(reading: _Reading, instruction: Instruction) -> None:
    reading.entrypoint = tuple(_exec_form(instruction))
    reading.cmd = ()  # as the engines do: an ENTRYPOINT resets the CMD set before it


def _cmd(reading: _Reading, instruction: Instruction) -> None:
    reading.cmd = tuple(_exec_form(instruction))


def _exec_form(instruction: Instruction) -> list[str]:
    if not instruction.value.startswith("["):
        raise DockerfileError(f"line {instruction.line}: the shell form of {instruction.keyword} is not supported "
                              f"(with ENTRYPOINT it would drop CMD): use the JSON form")
    return _json_words(instruction)


def _json_words(instruction: Instruction, text: str | None = None) -> list[str]:
    try:
        words = json.loads(instruction.value if text is None else text)
    except json.JSONDecodeError as exc:
        raise DockerfileError(f"line {instruction.line}: {instruction.keyword}: not a JSON list ({exc})") from None
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        raise DockerfileError(f"line {instruction.line}: {instruction.keyword}: not a JSON list of strings")
    return words


_READERS = {"FROM": _from, "ENV": _env, "WORKDIR": _workdir, "COPY": _copy, "RUN": _run, "USER": _user,
            "VOLUME": _volume, "EXPOSE": _expose, "HEALTHCHECK": _healthcheck, "ENTRYPOINT": _entrypoint,
            "CMD": _cmd}  # fmt: skip


def ignore_patterns(context: Path) -> list[re.Pattern[str]]:
    """The build context's .dockerignore as regular expressions over context-relative POSIX paths: ``*`` and ``?``
    within one path element, ``**`` across elements. Exceptions (``!``) and character classes are refused."""
    path = context / ".dockerignore"
    patterns: list[re.Pattern[str]] = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!") or "[" in line or "\\" in line:
            raise DockerfileError(f".dockerignore {line!r}: exceptions, classes and escapes are not supported")
        text = str(PurePosixPath("/", line))[1:]
        regex = re.escape(text).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        patterns.append(re.compile(regex))
    return patterns


def ignored(relative: PurePosixPath, patterns: list[re.Pattern[str]]) -> bool:
    """Whether .dockerignore leaves this context-relative path out (it or a directory above it matches)."""
    prefixes = [PurePosixPath(*relative.parts[:end]) for end in range(1, len(relative.parts) + 1)]
    return any(pattern.fullmatch(str(prefix)) for prefix in prefixes for pattern in patterns)
