"""Basic auth for the endpoint, at a cost no client can choose.

A bcrypt check costs tens of milliseconds of CPU by design. Checked on every request, wrong passwords would
let anyone who can reach the port spend the training process's CPU at will (a flood slowed training 3.7x), and
the time of a check that ran against the time of one that did not would tell valid user names from invalid
ones. So:
- a user:password pair that passed is remembered (a scrape pays one bcrypt check per process, not per request),
  and one that failed is remembered too: repeating it costs nothing;
- bcrypt checks are rationed: each peer address gets one every PEER_CHECK_SECONDS, and all peers together
  CHECKS_PER_SECOND; past the ration a request is refused (401) without a check (sha256 hashes cost
  microseconds and are not rationed). The ration is what bounds their CPU: it is not charged to the endpoint's
  request budget as well (`spent()`), where it would make every other client wait for an attacker's checks;
- an unknown user is checked against a decoy hash of the same cost, so unknown and known users take the same
  time;
- a password bcrypt cannot take (over 72 bytes) is a 401, like any wrong one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

CHECKS_PER_SECOND = 0.5  # bcrypt checks for all peers together (one costs ~60 ms of CPU at cost 10, more above)
PEER_CHECK_SECONDS = 2.0  # one check per peer address this often: one peer cannot take all of them
_REMEMBERED = 256  # passed and failed pairs kept (each set); past it the oldest are forgotten
_PEERS = 1024  # peers whose last check is remembered


def password_matches(password: str, hashed: str) -> bool:
    """bcrypt ($2a$/$2b$/$2y$) as in Prometheus' web config, or sha256:<hex> for machines without bcrypt."""
    if hashed.startswith("sha256:"):
        return hmac.compare_digest(hashlib.sha256(password.encode()).hexdigest(), hashed[len("sha256:"):])
    import bcrypt  # only needed when a bcrypt hash is configured: the `auth` extra

    try:
        return bool(bcrypt.checkpw(password.encode(), hashed.encode()))
    except ValueError:  # longer than bcrypt takes (72 bytes), or a malformed hash: not a match
        return False


class BasicAuth:
    """Decides whether an Authorization header names a configured user with the right password."""

    def __init__(self, users: Mapping[str, str], clock: Callable[[], float] = time.monotonic,
                 check: Callable[[str, str], bool] = password_matches) -> None:
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
        self._tokens = 2.0
        self._updated = clock()
        self._lock = threading.Lock()
        self._spent = threading.local()  # CPU seconds of this thread's checks since spent() last asked
        self.checks = 0  # password checks run, for tests and the reliability benchmark

    def __bool__(self) -> bool:
        return bool(self._users)

    def spent(self) -> float:
        """CPU seconds this thread spent in password checks since the last call (then 0 again)."""
        seconds = float(getattr(self._spent, "seconds", 0.0))
        self._spent.seconds = 0.0
        return seconds

    def allows(self, header: str, peer: str = "") -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return False
        hashed = self._users.get(user)
        against = hashed if hashed is not None else self._decoy
        fingerprint = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        with self._lock:
            if fingerprint in self._passed:
                return True
            if fingerprint in self._failed:
                return False
            if not against.startswith("sha256:") and not self._take_check(peer):  # a sha256 check costs ~1 µs
                return False
            self.checks += 1
        # The check itself runs without the lock: bcrypt releases the GIL, other requests go on meanwhile.
        began = time.thread_time()
        matched = self._check(password, against) and hashed is not None
        self._spent.seconds = getattr(self._spent, "seconds", 0.0) + time.thread_time() - began
        with self._lock:
            remembered = self._passed if matched else self._failed
            remembered[fingerprint] = None
            if len(remembered) > _REMEMBERED:
                remembered.popitem(last=False)
        return matched

    def _take_check(self, peer: str) -> bool:
        """Whether a check may run now for this peer (under the lock)."""
        now = self._clock()
        last = self._peer_checked.get(peer)
        if last is not None and now - last < PEER_CHECK_SECONDS:
            return False
        self._tokens = min(2.0, self._tokens + (now - self._updated) * CHECKS_PER_SECOND)
        self._updated = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        self._peer_checked[peer] = now
        self._peer_checked.move_to_end(peer)
        if len(self._peer_checked) > _PEERS:
            self._peer_checked.popitem(last=False)
        return True
