"""Basic auth at a cost no client can choose (ms_exporter/endpoint/basic_auth.py)."""

from __future__ import annotations

import base64
from pathlib import Path

import bcrypt
import pytest

from ms_exporter.endpoint import basic_auth
from ms_exporter.endpoint.basic_auth import BasicAuth, password_matches

PASSWORD = "correct horse"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counted_auth(clock: Clock) -> tuple[BasicAuth, list[str]]:
    checked: list[str] = []

    def check(password: str, hashed: str) -> bool:
        checked.append(hashed)
        return password_matches(password, hashed)

    return BasicAuth({"grafana": HASH, "prometheus": "sha256:" + "0" * 64}, clock, check), checked


def test_a_flood_of_wrong_passwords_runs_a_rationed_number_of_bcrypt_checks() -> None:
    clock = Clock()
    auth, checked = counted_auth(clock)
    for second in range(10):  # 100 different wrong passwords a second for 10 seconds, from 5 peers
        for attempt in range(100):
            assert not auth.allows(header("grafana", f"guess-{second}-{attempt}"), peer=f"10.0.0.{attempt % 5}")
        clock.now += 1.0
    assert 10 * basic_auth.CHECKS_PER_SECOND - 1 <= len(checked) <= 2 + 10 * basic_auth.CHECKS_PER_SECOND  # not 1,000


def test_a_repeated_wrong_password_costs_nothing_and_one_peer_cannot_take_every_check() -> None:
    clock = Clock()
    auth, checked = counted_auth(clock)
    for _ in range(50):
        auth.allows(header("grafana", "wrong"), peer="10.0.0.1")
        clock.now += 0.1
    assert len(checked) == 1  # remembered as failed
    for attempt in range(50):  # one peer, new guesses: one check per PEER_CHECK_SECONDS
        auth.allows(header("grafana", f"guess-{attempt}"), peer="10.0.0.1")
        clock.now += 0.1
    assert len(checked) - 1 <= 5 / basic_auth.PEER_CHECK_SECONDS + 1
    clock.now += 1.0
    assert auth.allows(header("grafana", PASSWORD), peer="10.0.0.2")  # another peer still gets its check


def test_unknown_users_cost_the_same_check_as_known_ones() -> None:
    clock = Clock()
    auth, checked = counted_auth(clock)
    assert not auth.allows(header("nobody", "x"), peer="a")
    clock.now += 10
    assert not auth.allows(header("grafana", "x"), peer="b")
    assert checked == [HASH, HASH]  # an unknown user is checked against the bcrypt decoy: the same time


def test_a_verified_password_is_served_without_a_check_even_during_a_flood() -> None:
    clock = Clock()
    auth, checked = counted_auth(clock)
    assert auth.allows(header("grafana", PASSWORD), peer="prometheus")
    for attempt in range(200):
        auth.allows(header("grafana", f"guess-{attempt}"), peer="attacker")
    assert auth.allows(header("grafana", PASSWORD), peer="prometheus")
    assert len(checked) == 2  # the first good one and one guess: the rest were over the ration


@pytest.mark.parametrize("password", ["x" * 73, "é" * 40, "x" * 1000])
def test_a_password_over_72_bytes_is_a_wrong_password(password: str) -> None:
    assert password_matches(password, HASH) is False
    assert BasicAuth({"grafana": HASH}).allows(header("grafana", password)) is False


@pytest.mark.parametrize("user", ["grafana", "nobody"])
def test_a_flood_from_two_addresses_cannot_lock_out_the_right_password(user: str) -> None:
    """Two addresses sending new wrong passwords 5 times a second (for a known user or an
    unknown one) took every bcrypt check, and a correct login got 401 at every try. The addresses now take turns:
    the right password gets its check within a turn of each other address, and is in at its next try."""
    clock = Clock()
    auth, checked = counted_auth(clock)
    tries = []
    for tick in range(300):  # 30 s in 0.1 s steps after a restart; the honest client tries once a second
        for attacker in ("10.0.0.1", "10.0.0.2"):
            if tick % 2 == 0:
                assert not auth.allows(header(user, f"guess-{tick}-{attacker}"), peer=attacker)
        if tick % 10 == 5:
            tries.append(auth.allows(header("grafana", PASSWORD), peer="10.0.0.9"))
        clock.now += 0.1
    assert True in tries[:3], tries  # in within 3 tries (2 s for the other addresses' turns, then its own)
    assert all(tries[tries.index(True) :])  # and remembered from then on
    assert len(checked) <= 2 + 30 * basic_auth.CHECKS_PER_SECOND  # the flood still gets no more than the ration


def test_addresses_take_turns_and_ipv6_counts_by_network() -> None:
    clock = Clock()
    auth, checked = counted_auth(clock)
    for attempt in range(40):  # one /64 network from ever new addresses: one address's turns
        auth.allows(header("grafana", f"guess-{attempt}"), peer=f"2001:db8::{attempt + 1:x}")
        clock.now += 0.1
    assert len(checked) <= 2 + 4 / basic_auth.PEER_CHECK_SECONDS
    assert basic_auth.peer_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert basic_auth.peer_key("2001:db8::1") == basic_auth.peer_key("2001:db8::ffff") == "2001:db8::/64"


def test_a_trusted_address_is_checked_before_a_thousand_new_ones_and_loses_its_place_when_it_fails() -> None:
    clock = Clock()
    auth, checked = counted_auth(clock)
    saved: list[list[str]] = []
    auth.trust(["10.9.9.9"], saved.append)  # the address an earlier process of this rank served
    for index in range(basic_auth._PEERS + 100):  # a new address each: the claim queue is full
        auth.allows(header("grafana", f"guess-{index}"), peer=f"10.1.{index // 250}.{index % 250}", checks=False)
    auth.run_due()  # the flood spends the burst
    burst = len(checked)
    assert auth.allows(header("grafana", PASSWORD), peer="10.9.9.9", checks=False) is False  # no check may run
    clock.now += 1 / basic_auth.CHECKS_PER_SECOND
    auth.run_due()  # the next check goes to the trusted address, not to the thousand that asked first
    assert len(checked) == burst + 1
    assert auth.allows(header("grafana", PASSWORD), peer="10.9.9.9", checks=False) is True
    assert saved == []  # already trusted: nothing to write
    clock.now += basic_auth.PEER_CHECK_SECONDS
    auth.allows(header("grafana", "a wrong one"), peer="10.9.9.9", checks=False)
    auth.run_due()
    assert len(checked) == burst + 2 and auth.trusted == [] and saved == [[]]  # it failed: trusted no more


def test_an_address_whose_password_passed_is_trusted_and_written(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    kept = basic_auth.TrustedPeersFile(tmp_path / "sub" / "scrapers.json", lambda component, exc: errors.append(exc))
    assert kept.load() == []  # no file yet: nothing trusted, nothing counted
    auth = BasicAuth({"grafana": HASH, "loki": bcrypt.hashpw(b"another", bcrypt.gensalt(4)).decode()})
    auth.trust(kept.load(), kept.save)
    assert auth.allows(header("grafana", PASSWORD), peer="::ffff:10.0.0.7") is True
    assert auth.allows(header("loki", "another"), peer="2001:db8::1") is True  # a pair not remembered: a check
    assert kept.load() == ["10.0.0.7", "2001:db8::/64"] and errors == []
    assert PASSWORD not in kept.path.read_text()


@pytest.mark.parametrize(
    "content", ['{"trusted": ["10.0.0.1", "not an address"]}', "[1, 2]", "{", '{"trusted": "10.0.0.1"}', "x" * 5000]
)
def test_a_trusted_peers_file_that_is_not_a_list_of_addresses_trusts_nobody_and_is_counted(
    tmp_path: Path, content: str
) -> None:
    errors: list[BaseException] = []
    path = tmp_path / "scrapers.json"
    path.write_text(content)
    assert basic_auth.TrustedPeersFile(path, lambda component, exc: errors.append(exc)).load() == []
    assert len(errors) == 1


def test_a_trusted_peers_file_reached_through_a_link_is_not_read(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    real = tmp_path / "elsewhere.json"
    real.write_text('{"trusted": ["10.0.0.1"]}')
    (tmp_path / "scrapers.json").symlink_to(real)
    assert basic_auth.TrustedPeersFile(tmp_path / "scrapers.json", lambda c, exc: errors.append(exc)).load() == []
    assert len(errors) == 1
