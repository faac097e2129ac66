"""Running a device tool (npu-smi, hccn_tool) from a hardware reader: no shell, a deadline, a cap on what it prints.

A reader's commands share one Deadline (the reading may take `hardware.timeout` seconds in all). A command still
running when it is up is killed with everything it started; one that prints more than OUTPUT_LIMIT is killed too.
Whatever goes wrong raises CommandError with the command line and the start of what it printed, for the hardware
monitor to count. Output is decoded as UTF-8 with undecodable bytes replaced: garbage never raises on its own.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time

# npu-smi's largest answer (the table of a 16-chip host) is about 10 KiB; anything past this is not a device tool.
OUTPUT_LIMIT = 256 * 1024
EXCERPT = 160  # characters of an unexpected output quoted in an error
REAP_WAIT = 1.0  # seconds to wait for a killed command to go


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
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a kill reaches whatever it started too
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
            self._stop(process)
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

    def _stop(self, process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            process.wait(timeout=REAP_WAIT)
        except subprocess.TimeoutExpired:
            self._stuck.append(process)


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
