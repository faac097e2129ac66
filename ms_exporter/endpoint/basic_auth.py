"""Basic auth for the endpoint, at a cost no client can choose and with a fair share for every client address.

A bcrypt check costs tens of milliseconds of CPU by design. Checked on every request, wrong passwords would
let anyone who can reach the port spend the training process's CPU at will (a flood slowed training 3.7x), and
the time of a check that ran against the time of one that did not would tell valid user names from invalid
ones. A ration alone is not enough either: when the checks go to whoever asks first, two addresses asking five
times a second take every one and a client with the right password never gets its check. So:
- a user:password pair that passed is remembered (a scrape pays one bcrypt check per process, not per request),
  and one that failed is remembered too: repeating it costs nothing;
- a pair not remembered is a claim, queued under its client's address (one claim per address: the first one
  waits for its turn, later new ones are refused at once). bcrypt checks are rationed, CHECKS_PER_SECOND for all
  addresses together and one per PEER_CHECK_SECONDS for each, and a check that may run goes to the address
  whose last check is the oldest (never checked comes first): the addresses take turns. A request whose claim
  is not checked right away is refused (401) without a check; the claim stays queued and its answer is
  remembered, so the client's next try is answered from memory. A client with the right password is in after
  at most one turn of every other address asking (PEER_CHECK_SECONDS apart for one other address, 1 /
  CHECKS_PER_SECOND for more) plus its own next try, whatever they send, once its claim is queued (_PEERS
  claims at most: past that a new address's claim waits for room). IPv6 clients count by their /64 network,
  which one host usually holds whole;
- addresses whose claim passed are trusted (the scrapers this rank has served, TRUSTED_PEERS at most): their
  claims are checked before any other address's, still under the ration and one per PEER_CHECK_SECONDS each,
  and an address whose check fails is trusted no more. Turns alone give every address the same share, so a flood
  from many addresses (any 127.x.y.z is this host's; a /16 is cheap elsewhere) pushes a scraper that must be
  checked again, after a restart most of all, behind one turn of each of them: 2 s per address, half an hour for
  a thousand. What tells the scraper apart is that it passed before, so the addresses (never a password or
  anything derived from one) are kept in a small file (TrustedPeersFile) that a restarted rank reads: its
  scrapers are checked first, within a turn, however many addresses ask. A flood reaches the trusted ones only
  by a trusted address, and then for one check: it fails and the address loses its place;
- an unknown user's claim is checked against a decoy hash of the same cost and takes its address's turn like
  any other. Keeping unknown users out of the ration would be visible (a second address would see whether a
  name spends the shared ration), so names cannot be told apart by time nor by turns; the turns are what keep
  a flood of unknown names from locking out the known users, and the ration bounds its CPU. The ration is not
  charged to the endpoint's request budget as well, where it would make every other client wait for an
  attacker's checks;
- sha256 hashes cost microseconds and are checked at once, unrationed;
- a password bcrypt cannot take (over 72 bytes) is a 401, like any wrong one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import itertools
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from ms_exporter.core.errors import OnError
from ms_exporter.core.files.safe_files import make_dir, read_small, replace_file

CHECKS_PER_SECOND = 0.5  # bcrypt checks for all peers together (one costs ~60 ms of CPU at cost 10, more above)
PEER_CHECK_SECONDS = 2.0  # one check per peer address this often: one peer cannot take all of them
_BURST = 2.0  # checks that may run back to back after a quiet while
_REMEMBERED = 256  # passed and failed pairs kept (each set); past it the oldest are forgotten
_PEERS = 1024  # peers whose last check, and peers whose claim, are remembered
TRUSTED_PEERS = 16  # addresses whose claim passed, checked first; past it the one that passed longest ago goes
_TRUSTED_FILE_BYTES = 4096  # a trusted peers file larger than this is not read


def password_matches(password: str, hashed: str) -> bool:
    """bcrypt ($2a$/$2b$/$2y$) as in Prometheus' web config, or sha256:<hex> for machines without bcrypt."""
    if hashed.startswith("sha256:"):
        return hmac.compare_digest(hashlib.sha256(password.encode()).hexdigest(), hashed[len("sha256:") :])
    import bcrypt  # only needed when a bcrypt hash is configured: the `auth` extra

    try:
        return bool(bcrypt.checkpw(password.encode(), hashed.encode()))
    except ValueError:  # longer than bcrypt takes (72 bytes), or a malformed hash: not a match
        return False


def peer_key(peer: str) -> str:
    """Whose turn a request takes: its address, an IPv6 one by its /64 network."""
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return peer
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return peer


class _Claim(NamedTuple):
    """A user:password pair waiting for its bcrypt check."""

    fingerprint: bytes
    password: str
    against: str  # the user's hash, or the decoy for an unknown user
    known: bool
    order: int  # when it was queued: the tie-break between addresses never checked


class BasicAuth:
    """Decides whether an Authorization header names a configured user with the right password."""

    def __init__(
        self,
        users: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
        check: Callable[[str, str], bool] = password_matches,
    ) -> None:
        self._users = dict(users)
        self._clock = clock
        self._check = check
        # The decoy: an unknown user's password is checked against a configured hash (a bcrypt one when there is
        # one: the costliest check) and the answer thrown away.
        hashes = sorted(self._users.values(), key=lambda hashed: hashed.startswith("sha256:"))
        self._decoy = hashes[0] if hashes else ""
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._failed: OrderedDict[bytes, None] = OrderedDict()
        self._peer_checked: OrderedDict[str, float] = OrderedDict()
        self._claims: dict[str, _Claim] = {}  # peer key -> its queued claim
        self._trusted: OrderedDict[str, None] = OrderedDict()  # peer keys whose claim passed, latest last
        self._on_trusted: Callable[[list[str]], None] | None = None
        self._order = itertools.count()
        self._tokens = _BURST
        self._updated = clock()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._users)

    def trust(self, peers: Iterable[str], on_change: Callable[[list[str]], None] | None = None) -> None:
        """Trust `peers` (the addresses an earlier process of this rank trusted) and tell `on_change` the trusted
        addresses whenever one is added or dropped (it is called from an answer thread, after a bcrypt check)."""
        with self._lock:
            for peer in list(peers)[-TRUSTED_PEERS:]:
                self._trusted[peer_key(peer)] = None
            self._on_trusted = on_change

    @property
    def trusted(self) -> list[str]:
        with self._lock:
            return list(self._trusted)

    def allows(self, header: str, peer: str = "", checks: bool = True) -> bool | None:
        """Whether `header` passes. With checks=False, None where a bcrypt check is due to run now (the caller
        then calls again with checks=True off its event loop); True or False otherwise, in microseconds."""
        claim = self._claim(header)
        if claim is None:
            return False
        if not claim.against.startswith("sha256:"):
            with self._lock:
                verdict = self._recall(claim.fingerprint)
                if verdict is not None:
                    return verdict
                key = peer_key(peer)
                # A trusted address's claim is queued however many others wait (there are TRUSTED_PEERS at most).
                if key not in self._claims and (len(self._claims) < _PEERS or key in self._trusted):
                    self._claims[key] = claim._replace(order=next(self._order))
                if not checks:
                    return None if self._due() is not None else False
            self.run_due()
            with self._lock:
                return self._recall(claim.fingerprint) is True
        matched = self._check(claim.password, claim.against) and claim.known  # a sha256 check costs ~1 µs
        self._remember(claim.fingerprint, matched)
        return matched

    def run_due(self) -> None:
        """Run the bcrypt checks whose turn has come (each address's oldest claim, in turn, under the ration)."""
        while True:
            with self._lock:
                key = self._due()
                if key is None:
                    return
                claim = self._claims.pop(key)
                self._tokens -= 1.0
                now = self._clock()
                self._peer_checked[key] = now
                self._peer_checked.move_to_end(key)
                if len(self._peer_checked) > _PEERS:
                    self._peer_checked.popitem(last=False)
            # The check itself runs without the lock: bcrypt releases the GIL, other requests go on meanwhile.
            matched = self._check(claim.password, claim.against) and claim.known
            self._remember(claim.fingerprint, matched)
            trusted = self._learn(key, matched)
            if trusted is not None and self._on_trusted is not None:
                self._on_trusted(trusted)

    def _learn(self, key: str, matched: bool) -> list[str] | None:
        """Trust an address whose claim passed, drop one whose claim failed; the trusted addresses if that changed
        them, else None."""
        with self._lock:
            if matched:
                known = key in self._trusted
                self._trusted[key] = None
                self._trusted.move_to_end(key)
                if len(self._trusted) > TRUSTED_PEERS:
                    self._trusted.popitem(last=False)
                return None if known else list(self._trusted)
            if key in self._trusted:
                del self._trusted[key]
                return list(self._trusted)
            return None

    def _claim(self, header: str) -> _Claim | None:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        hashed = self._users.get(user)
        fingerprint = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        return _Claim(fingerprint, password, hashed if hashed is not None else self._decoy, hashed is not None, 0)

    def _recall(self, fingerprint: bytes) -> bool | None:
        """What a pair's check said, if it is remembered (under the lock)."""
        if fingerprint in self._passed:
            return True
        if fingerprint in self._failed:
            return False
        return None

    def _remember(self, fingerprint: bytes, matched: bool) -> None:
        with self._lock:
            remembered = self._passed if matched else self._failed
            remembered[fingerprint] = None
            if len(remembered) > _REMEMBERED:
                remembered.popitem(last=False)

    def _due(self) -> str | None:
        """The peer whose claim is checked next, if a check may run now (under the lock)."""
        if not self._claims:
            return None
        now = self._clock()
        self._tokens = min(_BURST, self._tokens + (now - self._updated) * CHECKS_PER_SECOND)
        self._updated = now
        if self._tokens < 1.0:
            return None
        ready = [key for key in self._claims if now - self._peer_checked.get(key, -math.inf) >= PEER_CHECK_SECONDS]
        if not ready:
            return None
        return min(
            ready,
            key=lambda key: (key not in self._trusted, self._peer_checked.get(key, -math.inf), self._claims[key].order),
        )


class TrustedPeersFile:
    """Where a rank keeps its trusted addresses (save_dir/ms_exporter-scrapers-rank<r>.json), so that its next
    process checks its scrapers' passwords first. Addresses only: nothing in it helps to guess a password. Read
    and written through core/files/safe_files.py (no link followed, a bounded read); a file that cannot be read or
    written is counted under `prometheus` and the endpoint goes on without it."""

    def __init__(self, path: Path, on_error: OnError) -> None:
        self.path = path
        self._on_error = on_error

    def load(self) -> list[str]:
        try:
            data = json.loads(read_small(self.path, _TRUSTED_FILE_BYTES))
            peers = data["trusted"] if isinstance(data, dict) else None
            if not isinstance(peers, list) or not all(isinstance(peer, str) for peer in peers):
                raise ValueError(f"{self.path} holds no list of addresses under 'trusted'")
            for peer in peers:  # an address or an IPv6 /64, as peer_key() writes them
                ipaddress.ip_network(peer, strict=False)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:  # unreadable, a link, too large, not JSON, not addresses
            self._on_error("prometheus", exc)
            return []
        return list(peers)

    def save(self, peers: list[str]) -> None:
        try:
            make_dir(self.path.parent)
            replace_file(self.path, json.dumps({"trusted": peers}).encode())
        except OSError as exc:
            self._on_error("prometheus", exc)
