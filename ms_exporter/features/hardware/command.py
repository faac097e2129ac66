"""Running a device tool (npu-smi, hccn_tool) from a hardware reader: no shell, a deadline, a cap on what it prints.

Which file runs: `trusted_command` finds a tool by name only in directories that no other user can write to (PATH's
absolute entries, then the places the Ascend driver installs its tools), or takes the absolute path the config
names; an empty or relative PATH entry (the working directory) or a directory others can write is passed over, with
a log line that says why, so that another local user cannot plant a `npu-smi` that the training would run.

A reader's commands share one Deadline (the reading may take `hardware.timeout` seconds in all). A command still
running when it is up is killed with everything it started, a child that left its session (setsid) included; one
that prints more than OUTPUT_LIMIT is killed too. Whatever goes wrong raises CommandError with the command line and
the start of what it printed, for the hardware monitor to count. Output is decoded as UTF-8 with undecodable bytes
replaced: garbage never raises on its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import selectors
import signal
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping

logger = logging.getLogger("ms_exporter")

# npu-smi's largest answer (the table of a 16-chip host) is about 10 KiB; anything past this is not a device tool.
OUTPUT_LIMIT = 256 * 1024
EXCERPT = 160  # characters of an unexpected output quoted in an error
REAP_WAIT = 1.0  # seconds to wait for a killed command to go
# Where the Ascend driver puts npu-smi (/usr/local/sbin) and hccn_tool (driver/tools, or /usr/bin), and the system's
# own directories: searched after PATH's trusted entries, so that a training started with a bare PATH finds them.
KNOWN_LOCATIONS = (
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/usr/local/Ascend/driver/tools",
)
# Set in a command's environment: what it leaves running (a setsid child, reparented away) still carries it.
RUN_MARK = "MS_EXPORTER_TOOL_RUN"
FREEZE_ROUNDS = 8  # passes that stop newly found processes of a command before the kill; each stops a generation


class CommandError(RuntimeError):
    """A command that gave no usable answer: missing, failed, out of time, too long, or unreadable."""


class CommandTimeout(CommandError):
    """A command still running when the reading's time was up (it was killed)."""


class Deadline:
    """The time one reading (or identification) may take, shared by its commands."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()


class Runner:
    """Runs one command at a time; remembers a killed command that did not go (a process stuck in the driver ignores
    SIGKILL until the driver lets go) and reaps it later, never waiting on it."""

    def __init__(self) -> None:
        self._stuck: list[subprocess.Popen[bytes]] = []

    def run(self, argv: list[str], deadline: Deadline) -> str:
        """The command's stdout; CommandError unless it exits 0 within the deadline having printed at most
        OUTPUT_LIMIT bytes to each of stdout and stderr."""
        self.reap()
        shown = " ".join(argv)
        if deadline.left() <= 0:
            raise CommandTimeout(f"no time left to run `{shown}`: the reading took {deadline.seconds:g} s already")
        mark = secrets.token_hex(8)
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a kill reaches whatever it started too
                env={**os.environ, RUN_MARK: mark},
            )
        except OSError as exc:
            raise CommandError(f"`{shown}` could not start: {exc}") from exc
        try:
            out, err = _collect(process, deadline, shown)
            try:
                status = process.wait(timeout=max(deadline.left(), 0.0))
            except subprocess.TimeoutExpired:
                raise CommandTimeout(_late(shown, deadline)) from None
        except BaseException:  # out of time, too long, or anything else: never leave it running
            self._stop(process, mark)
            raise
        finally:
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        if status != 0:
            said = (err or out).decode("utf-8", errors="replace")
            raise CommandError(f"`{shown}` exited with status {status}: {excerpt(said)}")
        return out.decode("utf-8", errors="replace")

    def reap(self) -> None:
        self._stuck = [process for process in self._stuck if process.poll() is None]

    def _stop(self, process: subprocess.Popen[bytes], mark: str) -> None:
        """Kills the command and all it started. Its process group is only what stayed in it: a child that called
        setsid has a group of its own, and one whose parent died has another parent. So everything that descends
        from the command or carries its mark is stopped first (a stopped process cannot fork), generation by
        generation, and then killed."""
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGSTOP)
        stopped: set[int] = set()
        for _ in range(FREEZE_ROUNDS):
            found = _offspring(process.pid, mark) - stopped
            if not found:
                break
            for pid in found:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGSTOP)
            stopped |= found
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        for pid in stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            process.wait(timeout=REAP_WAIT)
        except subprocess.TimeoutExpired:
            self._stuck.append(process)


def _offspring(root: int, mark: str) -> set[int]:
    """The processes under `root` (by parent, from /proc), and every process of ours whose environment carries
    `mark`; empty where there is no /proc."""
    parents: dict[int, int] = {}
    marked: set[int] = set()
    needle = f"{RUN_MARK}={mark}".encode()
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return set()
    for entry in entries:
        pid = int(entry)
        if pid == root:
            continue
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{entry}/stat", "rb") as handle:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ")"
            parents[pid] = int(handle.read().rpartition(b")")[2].split()[1])
        with contextlib.suppress(OSError), open(f"/proc/{entry}/environ", "rb") as handle:
            if needle in handle.read().split(b"\0"):
                marked.add(pid)
    found = set(marked)
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in found}
        found |= frontier
    return found


def trusted_command(name: str, environ: Mapping[str, str] | None = None, what: str = "device tool") -> str | None:
    """The file to run for `name`: an absolute path as it is (the config named it); else the first executable
    `name` in PATH's trusted directories, then in KNOWN_LOCATIONS; None when there is none. A relative path, an
    empty or relative PATH entry (the working directory) and a directory or file that a user other than root and
    this process's own can write are never used: each one that held `name` is logged with why."""
    if os.path.isabs(name):
        return name if _executable(name) else None
    if os.sep in name:
        logger.warning(
            "ms_exporter: the %s %r is a relative path, which depends on the working directory; not run (name an "
            "absolute path, or a bare name to look for in trusted directories)",
            what,
            name,
        )
        return None
    env = os.environ if environ is None else environ
    path_entries = env.get("PATH", os.defpath).split(os.pathsep)
    for directory in _unique([*path_entries, *KNOWN_LOCATIONS]):
        candidate = os.path.join(directory, name)
        if not _executable(candidate):
            continue
        refused = _untrusted(directory, candidate)
        if refused is None:
            return os.path.abspath(candidate)
        logger.warning("ms_exporter: %s %s not run: %s", what, candidate, refused)
    return None


def _unique(entries: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for entry in entries:
        if entry not in seen:
            seen.append(entry)
    return seen


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _untrusted(directory: str, candidate: str) -> str | None:
    """Why a file found in `directory` may not run (None: it may): a relative directory, or a directory or file
    (after symbolic links: the file itself and the directory that holds it) that others can write to."""
    if not directory or not os.path.isabs(directory):
        shown = "an empty PATH entry" if not directory else f"the relative PATH entry {directory!r}"
        return f"{shown} is the working directory, which others may write to"
    real = os.path.realpath(candidate)
    for path in _unique([directory, candidate, os.path.dirname(real)]):
        reason = _writable_by_others(path)
        if reason is not None:
            return reason
    return None


def _writable_by_others(path: str) -> str | None:
    try:
        info = os.stat(path)
    except OSError as exc:
        return f"{path} cannot be checked ({exc.strerror})"
    owners = {0, os.getuid()}
    if info.st_uid not in owners:
        return f"{path} belongs to uid {info.st_uid}, neither root nor this process's user"
    if info.st_mode & stat.S_IWOTH:
        return f"{path} is writable by every user"
    if info.st_mode & stat.S_IWGRP and info.st_gid != 0:
        return f"{path} is writable by group {info.st_gid}"
    return None


def excerpt(text: str) -> str:
    """The start of an unexpected output, for an error message: control characters and all, as ascii() shows them."""
    shown = text.strip()
    return ascii(shown[:EXCERPT] + ("..." if len(shown) > EXCERPT else "")) if shown else "(nothing)"


def _late(shown: str, deadline: Deadline) -> str:
    return f"`{shown}` was still running when this reading's {deadline.seconds:g} s were up, and was killed"


def _collect(process: subprocess.Popen[bytes], deadline: Deadline, shown: str) -> tuple[bytes, bytes]:
    """stdout and stderr until both close, read together so that neither pipe fills and blocks the command."""
    if process.stdout is None or process.stderr is None:
        raise CommandError(f"`{shown}` started without its output pipes")
    output = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    with selectors.DefaultSelector() as selector:
        for fd in output:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline.left()
            if left <= 0:
                raise CommandTimeout(_late(shown, deadline))
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                output[key.fd] += chunk
                if len(output[key.fd]) > OUTPUT_LIMIT:
                    raise CommandError(f"`{shown}` printed more than {OUTPUT_LIMIT // 1024} KiB")
    return bytes(output[process.stdout.fileno()]), bytes(output[process.stderr.fileno()])
