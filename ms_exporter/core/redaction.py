"""Secrets out of what is printed and logged: passwords in URLs, query values, control characters."""

from __future__ import annotations

import re

# What check-config prints instead of a secret.
REDACTED = "<redacted>"
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
# user:password@ in a URL (a Pushgateway or collector behind basic auth), with or without its scheme (a value
# that failed the URL check): the password is never printed or logged.
_URL_PASSWORD = re.compile(r"(?P<head>(?:[a-zA-Z][a-zA-Z0-9+.-]*://|(?<![^\s'\"(=]))[^:/@\s'\"]*):[^@/\s'\"]*@")


def hide_url_passwords(text: str) -> str:
    """`text` with the password of every scheme://user:password@ in it replaced."""
    return _URL_PASSWORD.sub(rf"\g<head>:{REDACTED}@", text)


_URL_PARTS = re.compile(
    r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)?(?P<authority>[^/?#]*)(?P<path>[^?#]*)"
    r"(?:\?(?P<query>[^#]*))?",
    re.DOTALL,
)


def url_for_logs(url: str) -> str:
    """A collector's or Pushgateway's URL as logs, messages and check-config show it: the password of a user:password@
    and a bare token@ replaced, the value of every query parameter too (an ?api_key=...), no #fragment, and control
    characters escaped (a URL from an environment variable is not checked as monitor_config's are)."""
    parts = _URL_PARTS.match(url)
    if parts is None:  # not reached: every group may be empty, so the pattern matches any text
        return REDACTED
    authority = parts["authority"]
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        authority = f"{user}:{REDACTED}@{host}" if colon else f"{REDACTED}@{host}"
    shown = (parts["scheme"] or "") + authority + parts["path"]
    if parts["query"] is not None:
        shown += "?" + "&".join(
            f"{name}={REDACTED}" if sep else name
            for name, sep, _ in (item.partition("=") for item in parts["query"].split("&"))
        )
    return CONTROL_CHARACTERS.sub(lambda found: repr(found.group())[1:-1], shown)
