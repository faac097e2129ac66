"""The Ascend reader: the NPUs this rank uses, through Huawei's `npu-smi` command (and `hccn_tool` for the RoCE link).

Which NPUs: chips are named by their Chip Logic ID (`npu-smi info -m`), the ID the CANN runtime and
ASCEND_RT_VISIBLE_DEVICES use, and a chip is `npu<logic id>`. When ASCEND_RT_VISIBLE_DEVICES is set, the chips it
lists, read the way CANN reads it: up to the first entry that names no chip. Else, when ASCEND_VISIBLE_DEVICES (the
Ascend container runtime's physical IDs) is set, the chips it lists; a container numbers its own chips from 0, so when
its IDs are not the logic IDs npu-smi lists but there are as many chips as IDs, they are those chips in order. Else
every chip `npu-smi info -m` lists (every chip of every NPU `npu-smi info -l` counts). Of those, only the one at
DEVICE_ID when that is set and in range: MindSpore's device id counts the devices the process can see.

Each reading runs `npu-smi info` once (the table: health, HBM used / total), then per chip `npu-smi info -t common`
(temperature, power, AI core use and clock), `-t usages` (HBM bandwidth use) and `-t ecc` (HBM multi-bit errors) with
`-i <NPU ID> -c <Chip ID>`, and `hccn_tool -i <id> -link -g`. The ECC and link queries are tried once in devices():
a chip that does not answer them then (no RoCE port, a model without HBM ECC) has no such series, rather than a
reader that fails on every reading. Units become base units: MB -> bytes (MiB, as DCMI counts), percent -> ratio,
MHz -> hertz.

Every command runs through command.Runner: no shell, within what is left of `timeout` seconds for the whole reading
or identification, output capped, undecodable bytes replaced. One that is missing, exits non-zero, runs out of time,
prints too much or prints what does not parse raises CommandError, for the hardware monitor to count; a field
npu-smi leaves out or prints as NA is None (no series, never a 0). Sources: docs/hardware.md.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ms_exporter.core.compat import SLOTS, zip_strict
from ms_exporter.core.device.reading import DeviceIdentity, DeviceReading, HardwareReader
from ms_exporter.core.registry import ReaderEntry
from ms_exporter.features.hardware.command import (
    CommandError,
    CommandTimeout,
    Deadline,
    Runner,
    excerpt,
    trusted_command,
)

logger = logging.getLogger("ms_exporter")

NPU_SMI = "npu-smi"
HCCN_TOOL = "hccn_tool"
DEFAULT_TIMEOUT = 5.0
BYTES_PER_MEGABYTE = 1024 * 1024  # npu-smi's MB are DCMI's: mebibytes (a 64 GB HBM prints 65536)
PERCENT = 100.0
HERTZ_PER_MEGAHERTZ = 1e6
UNKNOWN_VALUES = frozenset({"", "NA", "N/A", "-"})  # npu-smi's "not available here"

# The environment variables that choose the chips, in the order they are consulted (module docstring).
RUNTIME_VISIBLE = "ASCEND_RT_VISIBLE_DEVICES"
CONTAINER_VISIBLE = "ASCEND_VISIBLE_DEVICES"
DEVICE_ID = "DEVICE_ID"

# The `name : value` fields read from each per-chip query. A query that prints none of its fields printed garbage.
COMMON_FIELDS = ("Temperature(C)", "NPU Real-time Power(W)", "Aicore Usage Rate(%)", "Aicore curFreq(MHZ)")
USAGES_FIELDS = ("HBM Bandwidth Usage Rate(%)", "HBM Capacity(MB)", "HBM Usage Rate(%)")
ECC_FIELDS = ("HBM Double Bit Error Count",)
BOARD_FIELDS = ("Chip Name", "Chip Type", "Chip Version", "VDie ID", "PCIe Bus Info")
LINK_FIELDS = ("link status",)


@dataclass(frozen=True, **SLOTS)
class Chip:
    """One NPU chip as `npu-smi info -m` lists it."""

    npu_id: int  # the `-i` of npu-smi
    chip_id: int  # the `-c` of npu-smi
    logic_id: int  # the runtime's device ID
    phy_id: int | None = None  # printed by -m on some models (Atlas A3), or known from ASCEND_VISIBLE_DEVICES

    @property
    def device(self) -> str:
        return f"npu{self.logic_id}"

    @property
    def physical(self) -> int:
        """npu-exporter's `id` and hccn_tool's `-i`: the physical ID, which is the logic ID on a host that shows
        npu-smi all its chips (a bare-metal server)."""
        return self.logic_id if self.phy_id is None else self.phy_id


class NpuSmiReader(HardwareReader):
    """Reads the chips this rank uses (module docstring) with npu-smi on each call."""

    name = "npu_smi"

    def __init__(
        self,
        command: str = NPU_SMI,
        timeout: float = DEFAULT_TIMEOUT,
        hccn_tool: str | None = HCCN_TOOL,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"the npu-smi timeout must be a positive number of seconds, not {timeout!r}")
        self._command = command
        self._timeout = float(timeout)
        self._hccn_tool = hccn_tool  # the name to look for on PATH when the chips are chosen
        self._hccn_path: str | None = None
        self._environ = environ  # None: os.environ when the chips are chosen
        self._chips: list[Chip] | None = None
        self._identities: list[DeviceIdentity] = []
        self._with_ecc: set[int] = set()  # logic IDs whose ECC query answered in devices()
        self._with_link: set[int] = set()  # and whose hccn_tool link query did
        self._runner = Runner()

    def devices(self) -> list[DeviceIdentity]:
        self._prepare()
        return list(self._identities)

    def read(self) -> list[DeviceReading]:
        chips = self._prepare()
        if not chips:
            return []
        deadline = Deadline(self._timeout)
        table = parse_table(self._npu_smi(deadline, ["info"]))
        readings = []
        for chip in chips:
            row = table.get((chip.npu_id, chip.chip_id))
            if row is None:
                raise CommandError(f"`{self._command} info` shows no row for NPU {chip.npu_id} chip {chip.chip_id}")
            common = self._query(deadline, "common", chip, COMMON_FIELDS)
            usages = self._query(deadline, "usages", chip, USAGES_FIELDS)
            ecc = self._query(deadline, "ecc", chip, ECC_FIELDS) if chip.logic_id in self._with_ecc else {}
            link = self._link(deadline, chip) if chip.logic_id in self._with_link else None
            used, total = _pair(row.get("HBM-Usage(MB)"))
            readings.append(
                DeviceReading(
                    chip.device,
                    temperature_celsius=number(common.get("Temperature(C)")),
                    power_watts=number(common.get("NPU Real-time Power(W)")),
                    utilization_ratio=_ratio(common.get("Aicore Usage Rate(%)")),
                    clock_hertz=_scaled(common.get("Aicore curFreq(MHZ)"), HERTZ_PER_MEGAHERTZ),
                    memory_utilization_ratio=_ratio(usages.get("HBM Bandwidth Usage Rate(%)")),
                    memory_used_bytes=_scaled(used, BYTES_PER_MEGABYTE),
                    memory_total_bytes=_scaled(total, BYTES_PER_MEGABYTE),
                    ecc_uncorrected_errors=number(ecc.get("HBM Double Bit Error Count")),
                    link_up=link,
                    healthy=_healthy(row.get("Health")),
                )
            )
        return readings

    def close(self) -> None:
        self._runner.reap()

    # -- once, before the first reading ------------------------------------------------------------------------------
    def _prepare(self) -> list[Chip]:
        """Choose the chips, read who they are and which optional queries they answer; retried until it succeeds."""
        if self._chips is not None:
            return self._chips
        deadline = Deadline(self._timeout)
        listed = parse_mapping(self._npu_smi(deadline, ["info", "-m"]))
        chips = chosen_chips(listed, os.environ if self._environ is None else self._environ)
        identities = [self._identity(deadline, chip) for chip in chips]
        self._hccn_path = trusted_command(self._hccn_tool, self._environ, "hccn_tool") if self._hccn_tool else None
        for chip in chips:
            if self._answers(chip, "ecc", partial(self._query, deadline, "ecc", chip, ECC_FIELDS)):
                self._with_ecc.add(chip.logic_id)
            if self._hccn_path and self._answers(chip, "link", partial(self._link, deadline, chip)):
                self._with_link.add(chip.logic_id)
        self._identities, self._chips = identities, chips
        return chips

    def _identity(self, deadline: Deadline, chip: Chip) -> DeviceIdentity:
        board = self._query(deadline, "board", chip, BOARD_FIELDS)
        name, kind, version = (_text(board.get(field)) for field in ("Chip Name", "Chip Type", "Chip Version"))
        return DeviceIdentity(
            chip.device,
            {
                "id": str(chip.physical),
                "vdie_id": "-".join(_text(board.get("VDie ID")).split()),  # npu-exporter joins DCMI's words with -
                "pcie_bus_info": _text(board.get("PCIe Bus Info")),
                # npu-exporter's model_name is DCMI's name-type-version; an A3's board lists no type: then unknown
                "model_name": f"{name}-{kind}-{version}" if name and kind and version else "",
            },
        )

    @staticmethod
    def _answers(chip: Chip, what: str, query: Callable[[], object]) -> bool:
        """Whether an optional query works for this chip. Running out of time says nothing about that: it raises."""
        try:
            query()
        except CommandTimeout:
            raise
        except CommandError as exc:
            logger.info(
                "ms_exporter: %s gets no %s series, its first %s query failed: %s", chip.device, what, what, exc
            )
            return False
        return True

    # -- the commands ------------------------------------------------------------------------------------------------
    def _query(self, deadline: Deadline, kind: str, chip: Chip, fields: Sequence[str]) -> dict[str, str]:
        args = ["info", "-t", kind, "-i", str(chip.npu_id), "-c", str(chip.chip_id)]
        return parse_fields(self._npu_smi(deadline, args), fields, self._shown(args))

    def _link(self, deadline: Deadline, chip: Chip) -> bool | None:
        if self._hccn_path is None:
            return None
        argv = [self._hccn_path, "-i", str(chip.physical), "-link", "-g"]
        status = parse_fields(self._runner.run(argv, deadline), LINK_FIELDS, " ".join(argv))["link status"]
        return {"UP": True, "DOWN": False}.get(status.upper())

    def _npu_smi(self, deadline: Deadline, args: list[str]) -> str:
        return self._runner.run([self._command, *args], deadline)

    def _shown(self, args: list[str]) -> str:
        return " ".join([self._command, *args])


def build(config: Any) -> list[HardwareReader]:
    """One reader for this rank's NPUs; [] when the npu-smi command (`config.npu_smi`) is in no trusted directory
    (command.trusted_command: never the working directory, nor one other users can write). Which NPUs are found only
    on the hardware thread, in devices(): build() runs no command."""
    command = trusted_command(str(getattr(config, "npu_smi", NPU_SMI)), what="npu-smi")
    if command is None:
        return []
    hccn_tool = getattr(config, "hccn_tool", HCCN_TOOL)
    return [NpuSmiReader(command, float(getattr(config, "timeout", DEFAULT_TIMEOUT)), hccn_tool)]


# -- which chips ------------------------------------------------------------------------------------------------------
def chosen_chips(listed: Sequence[Chip], environ: Mapping[str, str]) -> list[Chip]:
    """The chips this rank uses, in the order they are named (module docstring)."""
    chips = sorted(listed, key=lambda chip: chip.logic_id)
    runtime = environ.get(RUNTIME_VISIBLE, "").strip()
    container = environ.get(CONTAINER_VISIBLE, "").strip()
    if runtime:
        chips = _named(chips, _ids(runtime))
    elif container:
        chips = _in_container(chips, _ids(container))
    device_id = environ.get(DEVICE_ID, "").strip()
    if device_id.isdigit() and int(device_id) < len(chips):
        return [chips[int(device_id)]]
    return chips


def _ids(value: str) -> list[int | None]:
    """Comma-separated IDs, `a-b` ranges spread out (the container runtime writes them); None for an entry that is
    neither, where a reader of the list stops."""
    ids: list[int | None] = []
    for entry in value.split(","):  # not stripped: CANN stops at a space
        low, dash, high = entry.partition("-")
        if entry.isdigit():
            ids.append(int(entry))
        elif dash and low.isdigit() and high.isdigit() and int(low) <= int(high):
            ids.extend(range(int(low), int(high) + 1))
        else:
            ids.append(None)
    return ids


def _named(chips: list[Chip], ids: list[int | None]) -> list[Chip]:
    """The chips with these logic IDs, up to the first ID that names no chip (or one named already), as CANN does."""
    by_logic = {chip.logic_id: chip for chip in chips}
    named: list[Chip] = []
    for logic_id in ids:
        chip = by_logic.get(logic_id) if logic_id is not None else None
        if chip is None or chip in named:
            break
        named.append(chip)
    return named


def _in_container(chips: list[Chip], ids: list[int | None]) -> list[Chip]:
    """ASCEND_VISIBLE_DEVICES' chips: by logic ID where npu-smi shows them so (a host), else, when npu-smi shows as
    many chips as the list names (a container that renumbered them), those chips in order, which are these physical
    IDs."""
    known = [logic_id for logic_id in ids if logic_id is not None]
    if len(known) == len(ids) and {chip.logic_id for chip in chips} >= set(known):
        return _named(chips, ids)
    if len(known) == len(ids) == len(chips) and len(set(known)) == len(known):
        return [
            chip if chip.phy_id is not None else replace(chip, phy_id=phy) for chip, phy in zip_strict(chips, known)
        ]
    return _named(chips, ids)


# -- parsing npu-smi's output -----------------------------------------------------------------------------------------
def parse_fields(text: str, fields: Sequence[str], command: str) -> dict[str, str]:
    """`name : value` lines (npu-smi's `\\t%-30s : %s`, hccn_tool's `name: value`) as {name: value}, the first of a
    repeated name kept. Raises CommandError when none of `fields` is there: the command printed something else."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, colon, value = line.partition(":")
        if colon and name.strip():
            found.setdefault(name.strip(), value.strip())
    if not any(field in found for field in fields):
        raise CommandError(f"`{command}` printed none of {', '.join(fields)}: {excerpt(text)}")
    return found


def parse_mapping(text: str) -> list[Chip]:
    """`npu-smi info -m`: one row per chip under `NPU ID  Chip ID  Chip Logic ID  [Chip Phy-ID]  Chip Name`. An MCU
    row has `-` for its logic ID and is no chip here."""
    lines = text.splitlines()
    header = next((index for index, line in enumerate(lines) if "Chip Logic ID" in line), None)
    if header is None:
        if "no npu" in text.lower():  # "There is no NPU card on this server."
            return []
        raise CommandError(f"`npu-smi info -m` printed no `Chip Logic ID` table: {excerpt(text)}")
    with_phy = "Chip Phy-ID" in lines[header]
    chips = []
    for line in lines[header + 1 :]:
        words = line.split()
        if len(words) < 4 or not all(word.isdigit() for word in words[:3]):
            continue  # an MCU or CPU row (logic ID `-`), or not a row
        npu_id, chip_id, logic_id = (int(word) for word in words[:3])
        phy_id = int(words[3]) if with_phy and words[3].isdigit() else None
        chips.append(Chip(npu_id, chip_id, logic_id, phy_id))
    return chips


def parse_table(text: str) -> dict[tuple[int, int], dict[str, str]]:
    """`npu-smi info`'s table as {(NPU ID, chip): {column: value}}. Each chip has two rows under two header rows
    (`| NPU Name | Health | Power(W) Temp(C) ... |` then `| Chip ... | Bus-Id | AICore(%) ... HBM-Usage(MB) |`);
    a `used / total` cell reads as `used/total`. The process table after it is not read."""
    rows = [_cells(line) for line in text.splitlines() if line.lstrip().startswith("|")]
    start = next((index for index, cells in enumerate(rows) if ["Health"] in (cell.split() for cell in cells)), None)
    if start is None or start + 1 >= len(rows):
        raise CommandError(f"`npu-smi info` printed no table with a Health column: {excerpt(text)}")
    upper_names, lower_names = ([cell.split() for cell in row] for row in rows[start : start + 2])
    body = []
    for cells in rows[start + 2 :]:
        if any("Process" in cell for cell in cells):
            break
        body.append(cells)
    table: dict[tuple[int, int], dict[str, str]] = {}
    for upper, lower in zip(body[0::2], body[1::2]):
        row = {**_columns(upper_names, upper), **_columns(lower_names, lower)}
        npu_id, chip_id = row.get("NPU", ""), row.get("Chip", "")
        if npu_id.isdigit() and chip_id.isdigit():
            table[(int(npu_id), int(chip_id))] = row
    if not table:
        raise CommandError(f"`npu-smi info` printed a table without a chip row: {excerpt(text)}")
    return table


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _columns(names: list[list[str]], cells: list[str]) -> dict[str, str]:
    """A row's values by column name; {} for a row whose cells are not the header's."""
    if len(cells) != len(names):
        return {}
    values: dict[str, str] = {}
    for cell_names, cell in zip_strict(names, cells):
        values.update(zip(cell_names, re.sub(r"\s*/\s*", "/", cell).split()))
    return values


def number(value: str | None) -> float | None:
    """A finite number, or None for a value npu-smi does not know (NA, -) or one that is not a number."""
    if value is None or value.strip() in UNKNOWN_VALUES:
        return None
    try:
        parsed = float(value)
    except ValueError:
        return None
    return parsed if math.isfinite(parsed) else None


def _scaled(value: str | None, factor: float) -> float | None:
    parsed = number(value)
    return None if parsed is None else parsed * factor


def _ratio(percent: str | None) -> float | None:
    parsed = number(percent)
    return None if parsed is None else parsed / PERCENT  # a division: 57 * 0.01 is not 0.57


def _pair(value: str | None) -> tuple[str | None, str | None]:
    """`used/total` -> (used, total)."""
    if value is None or "/" not in value:
        return None, None
    used, _, total = value.partition("/")
    return used, total


def _healthy(value: str | None) -> bool | None:
    """npu-smi's health: OK, Warning, Alarm, Critical or UNKNOWN. Only OK is healthy; no value, no verdict."""
    if value is None or value in UNKNOWN_VALUES:
        return None
    return value == "OK"


def _text(value: str | None) -> str:
    return "" if value is None or value.strip() in UNKNOWN_VALUES else value.strip()


PART = ReaderEntry("npu_smi", build, order=20)
