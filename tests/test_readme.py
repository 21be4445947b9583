"""The README runs as written.

Every fenced ```bash and ```python block of README.md runs, in README order, in one demo
workspace: a temp folder holding a copy of ``configs/`` where ``alignflow run --config
configs/demo.yaml`` has run, and a copy of ``examples/``, the input files its commands read
(every ``examples/...`` path the README names must be in the repository). A block is left
out only under an HTML comment right above it, ``<!-- readme-test: skip (why) -->``; a
command block in another shell or Python dialect without one fails the structure test, so a
new example cannot slip in untested.

- bash blocks run under ``bash -euo pipefail``, with a ``curl`` on PATH that adds
  ``--fail-with-body``: an HTTP error fails the block.
- Long-running commands (``alignflow api``/``serve``, ``mlflow ui``/``models serve``, ...)
  are started by the harness in a process group of their own, and the rest of the block runs
  once they answer. The README's ports (8000, 5000) become free loopback ports, in the URLs
  and on the server's ``--port`` alike. A server stays up until the end of its README
  section (``##``), so a later block "with the service above still running" finds it; then
  SIGTERM to its process group must stop it and everything it started, alignflow's own
  within ``STOP_SECONDS`` and without a traceback.
- python blocks run with ``sys.executable`` in a subprocess.
- ``# -> ...`` after a statement is what it prints: JSON is compared by shape (keys and
  types, not values); "DataFrame with a `col` column" by the printed table.
- ``<!-- readme-test: exit N from `command` (why) -->`` above a block: that command must exit
  with status N (a gate that rejects, say); any other status fails the block.

Blocks build on those above them (one workspace; a section's servers), so the module runs in
README order in one process: ``make test`` hands out whole files (``--dist loadfile``).
"""

from __future__ import annotations

import ast
import json
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
EXAMPLES = "examples"  # the input files the README's commands read, in the repository

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RUNNABLE = ("bash", "python")
COMMAND_LANGUAGES = {*RUNNABLE, "sh", "shell", "console", "zsh", "py", "python3", "pycon", "ipython"}
STARTUP_SECONDS = 240  # a server answers within this, even on a loaded 2-core machine
STOP_SECONDS = 20  # alignflow's own exit, with every process they started, within this of SIGTERM
OTHERS_STOP_SECONDS = 60  # MLflow's and Prefect's: loose, theirs to keep
STEP_SECONDS = 600  # the commands of a block between two servers
TRACEBACK = "Traceback (most recent call last)"

FENCE = re.compile(r"^(?P<indent>\s*)```\s*(?P<language>[\w+-]*)")  # an info string may follow
MARKER = re.compile(r"^\s*<!--\s*readme-test:\s*(?P<body>.*?)\s*-->\s*$")
SKIP = re.compile(r"^skip \((?P<reason>.*\S.*)\)$")
EXIT = re.compile(r"^exit (?P<status>\d+) from `(?P<command>[^`]+)` \((?P<reason>.*\S.*)\)$")
EXPECTED_OUTPUT = re.compile(r"^\s*# -> (?P<text>.+)$")
DATAFRAME = re.compile(r"^DataFrame with an? `(?P<column>\w+)` column\b")
STILL_RUNNING = re.compile(r"\bstill running\b")
LOOPBACK_URL = re.compile(r"\b(?P<host>localhost|127\.0\.0\.1):(?P<port>\d{2,5})\b")
PORT_OPTION = re.compile(r"(?P<option>--port[ =])(?P<port>\d{2,5})\b")


# ---------------------------------------------------------------- reading the README


@dataclass(frozen=True)
class ExpectedExit:
    status: int
    command: str
    reason: str


@dataclass(frozen=True)
class Block:
    language: str
    line: int  # README line of its first line of code: what a failure names
    text: str
    section: str  # the `##` heading it sits under: its servers live as long as that
    prose: str  # README text between the previous block and this one
    skip: str | None = None
    exits: tuple[ExpectedExit, ...] = ()

    @property
    def runnable(self) -> bool:
        return self.language in RUNNABLE and self.skip is None

    @property
    def first_command(self) -> str:
        return next((s.strip() for s in self.text.splitlines() if s.strip() and not is_comment(s)), "")

    @property
    def test_id(self) -> str:
        words = re.sub(r"[^\w.]+", "-", " ".join(self.first_command.split()[:3])).strip("-")
        return f"L{self.line}-{words}"


def is_comment(line: str) -> bool:
    return line.lstrip().startswith("#")


def parse_readme(text: str) -> tuple[list[Block], list[str]]:
    """The README's fenced blocks with the markers above them, and what is wrong with the markers."""
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    section, prose, markers = "", [], []
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = FENCE.match(line)
        if marker := MARKER.match(line):
            markers.append((index + 1, marker["body"]))
        elif fence:
            end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == "```"), None)
            if end is None:
                problems.append(f"line {index + 1}: the fenced block never closes")
                break
            indent = len(fence["indent"])
            code = "\n".join(body[indent:] for body in lines[index + 1 : end])
            skip, exits = read_markers(markers, problems)
            language = fence["language"].lower()
            blocks.append(Block(language, index + 2, code, section, "\n".join(prose), skip, exits))
            prose, markers, index = [], [], end
        else:
            if markers:
                problems.append(f"line {markers[0][0]}: a readme-test marker must sit right above a fence")
                markers = []
            if "readme-test" in line:
                problems.append(f"line {index + 1}: not a readme-test marker: {line.strip()!r}")
            if line.startswith("## "):
                section = line[3:].strip()
            prose.append(line)
        index += 1
    return blocks, problems


def read_markers(markers: list[tuple[int, str]], problems: list[str]) -> tuple[str | None, tuple]:
    skip, exits = None, []
    for number, body in markers:
        if found := SKIP.match(body):
            skip = found["reason"].strip()
        elif found := EXIT.match(body):
            exits.append(ExpectedExit(int(found["status"]), found["command"], found["reason"]))
        else:
            problems.append(
                f"line {number}: readme-test marker {body!r}: expected `skip (why)` "
                "or `exit N from `command` (why)`"
            )
    return skip, tuple(exits)


def block_problems(block: Block) -> list[str]:
    """Why a block would go untested, or a marker of it names nothing."""
    where = f"README line {block.line} ({block.language})"
    if block.language in COMMAND_LANGUAGES and block.language not in RUNNABLE and block.skip is None:
        return [f"{where}: a command block this test cannot run: use ```bash or ```python, or skip it"]
    commands = [line.text.lstrip() for line in logical_lines(block.text, block.line)]
    return [
        f"{where}: `exit {e.status} from` names `{e.command}`, which no command of the block starts with"
        for e in block.exits
        if sum(c.startswith(e.command) for c in commands) != 1
    ]


BLOCKS, MARKER_PROBLEMS = parse_readme(README.read_text(encoding="utf-8"))
TESTED = [b for b in BLOCKS if b.language in RUNNABLE]


def last_runnable_of_its_section(block: Block) -> bool:
    return not any(b.runnable and b.section == block.section and b.line > block.line for b in BLOCKS)


# ---------------------------------------------------------------- lines and steps of a bash block


@dataclass(frozen=True)
class Line:
    number: int  # README line where it starts
    text: str  # one command, continuation lines joined as written


def logical_lines(text: str, first: int) -> list[Line]:
    """A block's commands, a backslash-continued one as one line, each with its README line."""
    lines, pending, start = [], [], first
    for offset, physical in enumerate(text.splitlines()):
        if not pending:
            start = first + offset
        pending.append(physical)
        if not physical.endswith("\\"):
            lines.append(Line(start, "\n".join(pending)))
            pending = []
    if pending:
        lines.append(Line(start, "\n".join(pending)))
    return lines


@dataclass(frozen=True)
class ServerKind:
    """A command the README leaves running: how to spot it, and how to know it is serving."""

    words: tuple[str, ...]
    default_port: int | None = None  # where it listens unless told `--port`
    ready_text: str | None = None  # what it prints once serving, when it has no port of its own

    def starts(self, command: str) -> bool:
        return tuple(command.split()[: len(self.words)]) == self.words

    @property
    def ours(self) -> bool:
        return self.words[0] == "alignflow"

    @property
    def stop_seconds(self) -> int:
        return STOP_SECONDS if self.ours else OTHERS_STOP_SECONDS


SERVER_KINDS = (
    ServerKind(("alignflow", "api"), default_port=8000),
    ServerKind(("alignflow", "serve"), ready_text="polling for scheduled runs"),  # cli/pipeline.py
    ServerKind(("mlflow", "ui"), default_port=5000),
    ServerKind(("mlflow", "server"), default_port=5000),
    ServerKind(("mlflow", "models", "serve"), default_port=5000),
    ServerKind(("prefect", "server", "start"), default_port=4200),
)


def server_kind(line: Line) -> ServerKind | None:
    return next((kind for kind in SERVER_KINDS if kind.starts(line.text)), None)


def steps(lines: list[Line]) -> list[tuple[ServerKind | None, list[Line]]]:
    """The block cut at each server: runs of ordinary commands, and servers one by one."""
    cut: list[tuple[ServerKind | None, list[Line]]] = []
    for line in lines:
        kind = server_kind(line)
        if kind is not None:
            cut.append((kind, [line]))
        elif cut and cut[-1][0] is None:
            cut[-1][1].append(line)
        else:
            cut.append((None, [line]))
    return cut


# ---------------------------------------------------------------- expected output


@dataclass(frozen=True)
class Expectation:
    line: int  # README line of the `# -> ...` comment
    text: str

    @property
    def begin(self) -> str:
        return f"<<readme-output L{self.line}>>"

    @property
    def end(self) -> str:
        return f"<<readme-output-end L{self.line}>>"


def printed_for(expectation: Expectation, stdout: str) -> str:
    start = stdout.find(expectation.begin)
    stop = stdout.find(expectation.end, start)
    assert start >= 0 and stop >= 0, f"README line {expectation.line}: the command before it never finished"
    return stdout[start + len(expectation.begin) : stop].strip()


def check_expected_output(expectation: Expectation, printed: str) -> None:
    """The README's `# -> ...` against what the command printed: its shape, not its numbers."""
    where = f"README line {expectation.line} (`# -> {expectation.text}`)"
    if expectation.text.startswith(("{", "[")):
        try:
            actual = json.loads(printed)
        except json.JSONDecodeError:
            pytest.fail(f"{where}: the command printed no JSON:\n{printed[-2000:]}")
        assert_same_shape(json.loads(expectation.text), actual, where)
    elif found := DATAFRAME.match(expectation.text):
        assert_dataframe_with_column(printed, found["column"], where)
    else:
        pytest.fail(f"{where}: no check here knows this expected output; teach check_expected_output")


def json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), "null")


def assert_same_shape(expected: object, actual: object, where: str, path: str = "$") -> None:
    """Every key the README shows is there, each value of the kind shown; more keys may follow."""
    kind, shown = json_kind(actual), json_kind(expected)
    assert kind == shown, f"{where}: {path} is a {kind} ({actual!r:.200}), the README shows a {shown}"
    if isinstance(expected, dict):
        missing = sorted(set(expected) - set(actual))
        assert not missing, f"{where}: {path} lacks {missing}; it has {sorted(actual)}"
        for key, value in expected.items():
            assert_same_shape(value, actual[key], where, f"{path}.{key}")
    elif isinstance(expected, list) and expected:
        assert actual, f"{where}: {path} is empty, the README shows items"
        for position, item in enumerate(actual):
            assert_same_shape(expected[0], item, where, f"{path}[{position}]")


def assert_dataframe_with_column(printed: str, column: str, where: str) -> None:
    """A printed pandas DataFrame: a header naming the column, then indexed rows of numbers."""
    rows = [row.split() for row in printed.splitlines() if row.strip()]
    assert rows and column in rows[0], f"{where}: no `{column}` column in:\n{printed[-2000:]}"
    position = rows[0].index(column) + 1  # each row starts with its index
    assert len(rows) > 1, f"{where}: a header without rows:\n{printed}"
    for row in rows[1:]:
        assert len(row) == len(rows[0]) + 1, f"{where}: not a row of the table: {row}"
        float(row[position])  # a number, or this raises naming the cell


# ---------------------------------------------------------------- scripts the harness runs


def bash_script(block: Block, lines: list[Line]) -> tuple[str, list[Expectation]]:
    """The commands as written, between printed markers where the README says what one prints,
    and with the status check of an `exit N from` marker around the command it names."""
    script = [f"# README.md line {lines[0].number}, run with bash -euo pipefail"]
    expectations = []
    for position, line in enumerate(lines):
        expected = expected_after(lines, position)
        if expected is not None:
            script.append(f"printf '\\n%s\\n' '{expected.begin}'")
        exit_ = next((e for e in block.exits if line.text.lstrip().startswith(e.command)), None)
        script.append(with_status_check(line, exit_) if exit_ else line.text)
        if expected is not None:
            script.append(f"printf '\\n%s\\n' '{expected.end}'")
            expectations.append(expected)
    unattached = [line.number for line in lines if EXPECTED_OUTPUT.match(line.text)]
    assert len(unattached) == len(expectations), (
        f"README lines {unattached}: a `# ->` comment goes right below the command whose output it shows"
    )
    return "\n".join(script) + "\n", expectations


def expected_after(lines: list[Line], position: int) -> Expectation | None:
    """The `# -> ...` comment right below a command: what that command prints."""
    if is_comment(lines[position].text) or position + 1 >= len(lines):
        return None
    found = EXPECTED_OUTPUT.match(lines[position + 1].text)
    return Expectation(lines[position + 1].number, found["text"].strip()) if found else None


def with_status_check(line: Line, expected: ExpectedExit) -> str:
    message = f"README line {line.number}: exit $readme_status, expected {expected.status}"
    return "\n".join(
        [
            "set +e",
            line.text,
            "readme_status=$?",
            "set -e",
            f'[ "$readme_status" -eq {expected.status} ] || {{ echo "{message}" >&2; exit 1; }}',
        ]
    )


def python_script(block: Block) -> tuple[str, list[Expectation]]:
    """The block as written, the statement above each `# -> ...` between printed markers."""
    lines = block.text.splitlines()
    statements = ast.parse(block.text).body
    before: dict[int, list[str]] = {}
    after: dict[int, list[str]] = {}
    expectations = []
    for number, text in enumerate(lines, start=1):
        found = EXPECTED_OUTPUT.match(text)
        if not found:
            continue
        expected = Expectation(block.line + number - 1, found["text"].strip())
        above = [s for s in statements if s.end_lineno < number]
        assert above, f"README line {expected.line}: `# ->` below no statement"
        before.setdefault(above[-1].lineno, []).append(f"print({expected.begin!r}, flush=True)")
        after.setdefault(above[-1].end_lineno, []).append(f"print({expected.end!r}, flush=True)")
        expectations.append(expected)
    script = []
    for number, text in enumerate(lines, start=1):
        script += before.get(number, []) + [text] + after.get(number, [])
    return "\n".join(script) + "\n", expectations


# ---------------------------------------------------------------- the workspace


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Ports:
    """A free loopback port for each port the README names, the same one all module long."""

    def __init__(self) -> None:
        self.chosen: dict[int, int] = {}

    def local(self, readme_port: int) -> int:
        while readme_port not in self.chosen:
            port = free_port()
            if port not in self.chosen.values():
                self.chosen[readme_port] = port
        return self.chosen[readme_port]

    def substitute(self, text: str) -> str:
        text = LOOPBACK_URL.sub(lambda m: f"{m['host']}:{self.local(int(m['port']))}", text)
        return PORT_OPTION.sub(lambda m: f"{m['option']}{self.local(int(m['port']))}", text)


@dataclass
class Workspace:
    root: Path  # cwd of every block
    logs: Path  # each step's script and output, for a failure's post-mortem
    env: dict[str, str]
    ports: Ports = field(default_factory=Ports)


CURL_SHIM = """#!/bin/sh
# the README's curl, failing on an HTTP error (status >= 400) as a reader would notice one
exec {curl} --fail-with-body --silent --show-error "$@"
"""


def write_curl_shim(folder: Path) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("the README's examples call curl: install it")
    shim = folder / "curl"
    shim.write_text(CURL_SHIM.format(curl=curl), encoding="utf-8")
    shim.chmod(0o755)


def block_environment(base: Path, shims: Path) -> dict[str, str]:
    """What a reader's shell holds: the venv's commands on PATH, $TOKEN, no hub; no service
    settings from this session (tests elsewhere may point them at their own servers)."""
    foreign = ("MLFLOW_TRACKING_URI", "PREFECT_API_", "ALIGNFLOW_API_", "PYTEST_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(foreign)}
    env.update(
        PATH=os.pathsep.join([str(shims), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        HF_HUB_OFFLINE="1",
        TOKEN=secrets.token_urlsafe(24),
        # this run's own Prefect database: a parallel run's servers write to theirs
        PREFECT_HOME=str(base / "prefect-home"),
    )
    return env


def tail(path: Path, chars: int = 3000) -> str:
    return read_from(path)[-chars:]


def read_from(path: Path, offset: int = 0) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as text:
        text.seek(offset)
        return text.read().decode("utf-8", errors="replace")


def run_to_completion(workspace: Workspace, argv: list[str], name: str, where: str) -> str:
    """Run a command in the workspace, its own process group ended with it; its stdout, or a
    failure naming ``where`` with the tail of what it printed."""
    out, err = workspace.logs / f"{name}.out", workspace.logs / f"{name}.err"
    began, cpu = time.monotonic(), children_cpu_seconds()
    with out.open("w") as stdout, err.open("w") as stderr:  # files: a straggler may hold them open
        process = subprocess.Popen(
            argv, cwd=workspace.root, env=workspace.env, stdout=stdout, stderr=stderr, start_new_session=True
        )
        try:
            status = process.wait(timeout=STEP_SECONDS)
        except subprocess.TimeoutExpired:
            status = None
        finally:
            signal_group(process.pid, signal.SIGKILL)  # what it left behind, or all of it on timeout
            process.wait()
    took = f"{time.monotonic() - began:.1f}s wall, {children_cpu_seconds() - cpu:.1f}s CPU"
    print(f"{where}: {took}")  # the module's budget, step by step (pytest -rP shows it)
    if status != 0:
        what = f"still running after {STEP_SECONDS}s" if status is None else f"exit {status}"
        pytest.fail(f"{where}: {what}\n--- stdout\n{tail(out)}\n--- stderr\n{tail(err)}", pytrace=False)
    return out.read_text(encoding="utf-8", errors="replace")


def children_cpu_seconds() -> float:
    """CPU time of the processes this one has waited for, and theirs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def signal_group(pgid: int, signum: int) -> None:
    with suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pgid, signum)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    """The demo workspace every block runs in: the demo run done, the user's files in place."""
    base = tmp_path_factory.mktemp("readme")
    root, logs, shims = base / "workspace", base / "logs", base / "bin"
    for folder in (root, logs, shims):
        folder.mkdir()
    shutil.copytree(REPO / "configs", root / "configs")  # symlinks followed: demo.yaml is one
    shutil.copytree(REPO / EXAMPLES, root / EXAMPLES)  # the input files the README's commands read
    write_curl_shim(shims)
    space = Workspace(root, logs, block_environment(base, shims))
    demo = ["alignflow", "run", "--config", "configs/demo.yaml"]
    printed = run_to_completion(space, demo, "demo-run", "the demo run the README's examples start from")
    assert "alignflow-demo-policy v1: promoted to champion" in printed, printed[-3000:]
    return space


# ---------------------------------------------------------------- servers


@dataclass
class Server:
    kind: ServerKind
    command: str
    line: int
    section: str
    log: Path
    process: subprocess.Popen
    port: int | None

    def __str__(self) -> str:
        return f"README line {self.line} `{' '.join(self.command.split())}`"

    def serving(self) -> bool:
        if self.port is not None:
            with socket.socket() as sock:
                sock.settimeout(0.5)
                return sock.connect_ex(("127.0.0.1", self.port)) == 0
        return self.kind.ready_text in read_from(self.log)


def with_port(kind: ServerKind, command: str, ports: Ports) -> tuple[str, int | None]:
    """The command listening on this run's port for the README's: `--port` added after the
    command's own words where the README relies on the default."""
    given = PORT_OPTION.search(command)
    if given:
        return command, int(given["port"])
    if kind.default_port is None:
        return command, None
    port = ports.local(kind.default_port)
    head = re.compile(r"^\s*" + r"\s+".join(map(re.escape, kind.words)))
    return head.sub(lambda m: f"{m[0]} --port {port}", command, count=1), port


def still_alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def family_of(pid: int) -> list[psutil.Process]:
    """A process and everything below it, whatever process group each is in."""
    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return []


class Servers:
    """Servers the README started, by section: started, waited for, stopped and judged."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.running: list[Server] = []

    def start(self, kind: ServerKind, line: Line, section: str) -> Server:
        command, port = with_port(kind, line.text, self.workspace.ports)
        log = self.workspace.logs / f"server-L{line.number}.log"
        with log.open("w") as output:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.workspace.root,
                env=self.workspace.env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = Server(kind, command, line.number, section, log, process, port)
        self.running.append(server)
        self.wait_until_serving(server)
        return server

    def wait_until_serving(self, server: Server) -> None:
        began = time.monotonic()
        while time.monotonic() < began + STARTUP_SECONDS:
            if server.process.poll() is not None:
                status = server.process.returncode
                pytest.fail(f"{server} exited ({status}) before serving:\n{tail(server.log)}")
            if server.serving():
                print(f"{server}: serving after {time.monotonic() - began:.1f}s")
                return
            time.sleep(0.25)
        pytest.fail(f"{server} not serving after {STARTUP_SECONDS}s:\n{tail(server.log)}")

    def in_section(self, section: str) -> list[Server]:
        return [s for s in self.running if s.section == section]

    def outside(self, section: str) -> list[Server]:
        return [s for s in self.running if s.section != section]

    def stop(self, servers: list[Server]) -> list[str]:
        """Stop them, the last started first; what went wrong on the way."""
        problems = []
        for server in reversed(servers):
            self.running.remove(server)
            problems += stop(server)
        return problems


def stop(server: Server) -> list[str]:
    """SIGTERM to its process group, as a service manager sends it; it, and every process it
    started, must be gone in time; alignflow's own exit cleanly, without a traceback."""
    family = family_of(server.process.pid)
    said_before = server.log.stat().st_size
    began, bound = time.monotonic(), server.kind.stop_seconds
    signal_group(server.process.pid, signal.SIGTERM)
    problems = []
    try:
        server.process.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        signal_group(server.process.pid, signal.SIGKILL)
        server.process.wait()
        problems.append(f"{server}: still running {bound}s after SIGTERM (killed)")
    while any(still_alive(p) for p in family) and time.monotonic() - began < bound:
        time.sleep(0.1)
    survivors = [p for p in family if still_alive(p)]
    for process in survivors:
        process.kill()
    if survivors:
        problems.append(f"{server}: left running {bound}s after SIGTERM: {[p.pid for p in survivors]}")
    gone = time.monotonic() - began
    print(f"{server}: exit {server.process.returncode}, all gone {gone:.1f}s after SIGTERM")
    if server.kind.ours:
        said = read_from(server.log, said_before)
        if server.process.returncode not in (0, 128 + signal.SIGTERM):
            problems.append(f"{server}: exit {server.process.returncode} on SIGTERM:\n{said[-3000:]}")
        if TRACEBACK in said:
            problems.append(f"{server}: a traceback while stopping:\n{said[-3000:]}")
    return problems


@pytest.fixture(scope="module")
def servers(workspace) -> Iterator[Servers]:
    started = Servers(workspace)
    yield started
    started.stop(list(started.running))  # a section cut short (a failure, -k): nothing outlives the module


# ---------------------------------------------------------------- running a block


def run_bash_block(block: Block, workspace: Workspace, servers: Servers) -> None:
    lines_of_block = logical_lines(workspace.ports.substitute(block.text), block.line)
    for position, (kind, lines) in enumerate(steps(lines_of_block)):
        if kind is not None:
            servers.start(kind, lines[0], block.section)
            continue
        script, expectations = bash_script(block, lines)
        path = workspace.logs / f"L{block.line}-{position}.sh"
        path.write_text(script, encoding="utf-8")
        where = f"README lines {lines[0].number}-{lines[-1].number}"
        printed = run_to_completion(workspace, ["bash", "-euo", "pipefail", str(path)], path.stem, where)
        for expected in expectations:
            check_expected_output(expected, printed_for(expected, printed))


def run_python_block(block: Block, workspace: Workspace) -> None:
    script, expectations = python_script(block)
    path = workspace.logs / f"L{block.line}.py"
    path.write_text(script, encoding="utf-8")
    where = f"README python block at line {block.line}"
    printed = run_to_completion(workspace, [sys.executable, str(path)], path.stem, where)
    for expected in expectations:
        check_expected_output(expected, printed_for(expected, printed))


def require_the_servers_it_relies_on(block: Block, servers: Servers) -> None:
    """A block whose prose says the service above is still running needs its section's server up."""
    if STILL_RUNNING.search(block.prose):
        up = [s for s in servers.in_section(block.section) if s.process.poll() is None]
        assert up, f"README line {block.line} runs with the service above still running, and none is"


def test_every_command_block_is_run_or_skipped_with_a_reason():
    assert TESTED, "no ```bash or ```python block found in README.md: is the parser broken?"
    fences = [line for line in README.read_text(encoding="utf-8").splitlines() if FENCE.match(line)]
    assert len(fences) == 2 * len(BLOCKS), "a fence the parser did not pair with another"
    problems = MARKER_PROBLEMS + [p for block in BLOCKS for p in block_problems(block)]
    assert not problems, "\n".join(problems)


UNTESTABLE = {
    "a shell block in another dialect": "## A\n\n```sh\nalignflow doctor\n```\n",
    "a skip without a reason": "## A\n\n<!-- readme-test: skip -->\n```bash\nalignflow doctor\n```\n",
    "a marker a blank line above": "## A\n\n<!-- readme-test: skip (why) -->\n\n```bash\nmake\n```\n",
    "an exit marker naming no command": (
        "## A\n\n<!-- readme-test: exit 1 from `alignflow promote` (why) -->\n```bash\nmake\n```\n"
    ),
}


@pytest.mark.parametrize("readme", UNTESTABLE.values(), ids=UNTESTABLE.keys())
def test_an_example_that_would_go_untested_is_a_problem(readme: str):
    blocks, problems = parse_readme(readme)
    assert problems + [p for block in blocks for p in block_problems(block)]


def test_blocks_keep_their_readme_line_section_and_markers():
    readme = (
        "intro\n## Serving\n\nstart it (the service above still running):\n\n"
        "<!-- readme-test: exit 1 from `alignflow promote` (no ratings) -->\n"
        '```bash\nalignflow promote --human \\\n    --agent a\n# -> {"a": 1}\n```\n'
        "```\na diagram\n```\n"
    )
    blocks, problems = parse_readme(readme)
    assert not problems
    block, diagram = blocks
    assert (block.language, block.line, block.section, block.runnable) == ("bash", 8, "Serving", True)
    assert block.exits == (ExpectedExit(1, "alignflow promote", "no ratings"),)
    assert STILL_RUNNING.search(block.prose) and block.test_id == "L8-alignflow-promote-human"
    assert [line.number for line in logical_lines(block.text, block.line)] == [8, 10]
    assert diagram.language == "" and not diagram.runnable


EXAMPLE_PATH = re.compile(r"\bexamples/[\w.-]*\w(?:/[\w.-]*\w)*")


def example_paths(text: str) -> list[str]:
    """Every ``examples/...`` file a text names, in prose or in a command, in order."""
    return EXAMPLE_PATH.findall(text)


def test_example_paths_are_found_in_prose_and_commands():
    text = (
        "Try `examples/pairs.jsonl`.\n"
        "alignflow eval reward --data examples/hh-style.jsonl.gz \\\n"
        "The folder examples/ itself is not a file."
    )
    assert example_paths(text) == ["examples/pairs.jsonl", "examples/hh-style.jsonl.gz"]


def test_every_example_file_the_readme_names_is_in_the_repository():
    """The README's commands read their input from examples/: a reader's clone must hold each file."""
    named = sorted(set(example_paths(README.read_text(encoding="utf-8"))))
    assert named, "README.md names no file under examples/: is EXAMPLE_PATH broken?"
    missing = [name for name in named if not (REPO / name).is_file()]
    assert not missing, f"README.md names files that examples/ does not hold: {missing}"


def test_examples_readme_lists_every_example_file():
    listing = (REPO / EXAMPLES / "README.md").read_text(encoding="utf-8")
    files = sorted(p.name for p in (REPO / EXAMPLES).iterdir() if p.is_file() and p.name != "README.md")
    assert files, "examples/ holds no example file"
    unlisted = [name for name in files if f"`{name}`" not in listing]
    assert not unlisted, f"examples/README.md does not list {unlisted}"


def test_the_ui_commands_the_readme_shows_are_those_a_run_prints(monkeypatch, tmp_path):
    """The first hour's "Open the UIs" lines are what `alignflow run` prints in a workspace."""
    from rich.console import Console

    from alignflow.cli import pipeline

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(Path.cwd() / ".alignflow" / "prefect"))
    console = Console(width=200, no_color=True)
    monkeypatch.setattr(pipeline, "console", console)
    summary = {
        "project": "p", "stages": [], "data_version": None, "wall_seconds": 1.0,
        "compute_seconds": 1.0, "orchestration_overhead": 0.0, "tracking_uri": None,
    }  # fmt: skip
    with console.capture() as captured:
        pipeline.render_summary(summary)
    printed = captured.get().split("Open the UIs:\n", 1)[1]
    shown = [line for line in printed.splitlines() if line.strip()]
    assert len(shown) == 2, printed
    readme = README.read_text(encoding="utf-8")
    for line in shown:
        assert line in readme, f"README.md does not show the line a run prints: {line!r}"


def as_param(block: Block):
    """A block to run, or one skipped for the reason the README gives (without the workspace)."""
    marks = [pytest.mark.skip(reason=f"README line {block.line}: {block.skip}")] if block.skip else []
    return pytest.param(block, id=block.test_id, marks=marks)


@pytest.mark.parametrize("block", [as_param(b) for b in TESTED])
def test_readme_block_runs_as_written(block: Block, workspace: Workspace, servers: Servers):
    servers.stop(servers.outside(block.section))  # left by a section cut short
    require_the_servers_it_relies_on(block, servers)
    try:
        if block.language == "python":
            run_python_block(block, workspace)
        else:
            run_bash_block(block, workspace, servers)
    except BaseException:
        servers.stop(servers.in_section(block.section))
        raise
    if last_runnable_of_its_section(block):
        problems = servers.stop(servers.in_section(block.section))
        assert not problems, "\n".join(problems)
