"""Is the Hugging Face hub reachable? Asked once per process, in at most a few seconds.

Without a network the libraries retry for ~25–50 s before failing; clbench asks first and, when
the hub is unreachable, has them read their local caches only, so a missing resource fails fast
with a message naming it and its offline alternative.
"""

from __future__ import annotations

import os
import socket
from functools import cache
from urllib.parse import urlparse

ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
PROBE_SECONDS = 3.0


@cache
def reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(ENDPOINT)
    try:
        with socket.create_connection(
            (url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=PROBE_SECONDS
        ):
            return True
    except OSError:
        return False
