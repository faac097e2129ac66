"""Who may read a rank, and what the operator tools read, against an adversary: the `make reliability` cases of
benchmarks/adversary_access.py played for real (child processes, a real socket flood, a real FIFO)."""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path

import bcrypt

from benchmarks.adversary_access import CASES, HONEST, IN_WITHIN_SECONDS

CASE = {case.key: case for case in CASES}


def test_a_flood_from_many_addresses_cannot_keep_a_restarted_ranks_scraper_out(tmp_path: Path) -> None:
    """Wrong passwords from a new address each (180 a second) queue one bcrypt claim per address; a rank that
    restarted on its port under them used to check the new addresses first, 2 s each, and to queue no claim past
    1,024: its scraper's right password stayed out for as long as the flood lasted. The scraper's address passed
    before the restart, so it is checked first: it is in within a turn, and every scrape after that passes."""
    case = CASE["password-flood"]
    facts = case.run(tmp_path)
    assert case.holds(facts), facts
    assert facts["trusted_file"] == {"trusted": [HONEST]}  # addresses only: no password, nothing derived from one
    assert facts["flood_before_scraper"] >= 600  # the claim queue was full of new addresses when it came back
    assert facts["in_after_restart_seconds"] <= IN_WITHIN_SECONDS
    assert facts["throughout"]["ok"] == facts["throughout"]["scrapes"] > 0
    assert facts["first_process"]["errors"] == facts["second_process"]["errors"] == []


def test_triage_reads_the_event_file_it_checked_and_never_opens_a_fifo_swapped_in(tmp_path: Path) -> None:
    """`ms-exporter triage` checked an event file (O_NOFOLLOW, a regular file) and then TensorBoard's reader
    opened it again by name: a link to a FIFO put there in between hung the triage for ever. The records are read
    through the checked descriptor now: the swap (made certain by a hook right after the checked open) changes
    nothing, the run's steps are read, and the child process ends."""
    case = CASE["triage-fifo"]
    facts = case.run(tmp_path)
    assert case.holds(facts), facts
    assert facts["swapped"] == 1 and not facts["timed_out"] and facts["rc"] == 0
    assert facts["read_steps"], facts["row"]


def test_a_monitor_keeps_its_scrapers_addresses_in_save_dir_for_its_next_process(tmp_path: Path) -> None:
    """The wiring the flood case relies on, through the real monitor: a scrape whose bcrypt password passed leaves
    its address in save_dir/ms_exporter-scrapers-rank0.json, and the next monitor of that save_dir trusts it."""
    from ms_exporter import TrainingMonitor
    from ms_exporter.sinks.prometheus import PrometheusEndpoint

    users = {"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(4)).decode()}
    options = {"port": 0, "project": "access", "save_dir": str(tmp_path), "web": {"basic_auth_users": users}}
    first = TrainingMonitor(**options)
    try:
        request = urllib.request.Request(first.url or "")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"prometheus:right").decode())
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
    finally:
        first.close()
    assert json.loads((tmp_path / "ms_exporter-scrapers-rank0.json").read_text()) == {"trusted": ["127.0.0.1"]}
    second = TrainingMonitor(**options)
    try:
        endpoint = second.part_of(PrometheusEndpoint)
        assert endpoint is not None and endpoint._server.pages.auth.trusted == ["127.0.0.1"]
    finally:
        second.close()
