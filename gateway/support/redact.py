"""URLs with their passwords masked, for every place a URL is shown: the start-up line, ``/kvgate/status``, a
config error, a backend's label in error messages and log lines, ``kvgate check``'s output.

    http://ops:s3cret@gpu0:11434          ->  http://ops:****@gpu0:11434
    redis://:s3cret@redis:6379/0          ->  redis://:****@redis:6379/0
    redis://redis:6379/0?password=s3cret  ->  redis://redis:6379/0?password=****

Pure text work, no parsing library: a URL that a parser would refuse (a bad port, an odd scheme) is masked all the
same, since that is exactly the URL a config error shows.
"""

from __future__ import annotations

import re

MASK = "****"

_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*:/*)(?P<user>[^/?#@:]*):(?P<password>.*)@")
"""scheme, slashes (any number: ``redis:/x:pw@h`` is a typo that still carries a password), user, ``:``, password
up to the last ``@`` (an unencoded ``/`` or ``@`` in it is a mistake that must not show the rest): rather too much
masked than a password shown."""
_QUERY_SECRET = re.compile(r"(?P<key>[?&](?:password|passwd|pass|pwd|token|secret|api_key|key)=)(?P<value>[^&#]*)",
                           re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with the password of its user-info and every secret-named query value replaced by ``****``; other
    text unchanged (a string that is no URL comes back as it is)."""
    masked = _USERINFO.sub(lambda m: f"{m['head']}{m['user']}:{MASK}@" if m["password"] else m[0], url, count=1)
    return _QUERY_SECRET.sub(lambda m: m["key"] + (MASK if m["value"] else ""), masked)


def secrets_of(url: str) -> tuple[str, ...]:
    """The password and secret query values ``url`` carries (to mask them in text that quotes the URL, like a
    library's error message)."""
    found = _USERINFO.match(url)
    values = [found["password"]] if found else []
    values += [m["value"] for m in _QUERY_SECRET.finditer(url)]
    return tuple(value for value in values if value)


def mask_in(text: str, url: str) -> str:
    """``text`` with every secret of ``url`` in it masked."""
    for secret in secrets_of(url):
        text = text.replace(secret, MASK)
    return text


def has_secret(url: str) -> bool:
    """Whether ``url`` carries a password or a secret-named query value (``mask_url`` would change it)."""
    return mask_url(url) != url
