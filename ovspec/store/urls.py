"""URLs as ovspec shows them: the user-info of a URL (``http://user:secret@host``) is a
credential, so every message that may carry a URL (an endpoint in a client's error, a
``--remote`` value) passes through ``redact`` before it is shown or raised.
"""

from __future__ import annotations

import re

# scheme://[user-info@]: user-info is everything up to the last '@' before the host's
# end ('/', '?', '#', whitespace or a quote), as RFC 3986 reads it.
_USER_INFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"<>]*@")
REDACTED = "***"


def redact(text: str) -> str:
    """``text`` with the user-info of every URL in it replaced by ``***``."""
    return _USER_INFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)


def has_user_info(url: str) -> bool:
    return _USER_INFO.search(url) is not None
