"""Checking that a webhook delivery came from the hub.

Each delivery carries ``Sandhub-Signature: t=<unix seconds>,v1=<hex>``, the
HMAC-SHA256 of ``"<t>.<body>"`` under the webhook's secret (Stripe's scheme),
and ``Sandhub-Event-Id``. Verify the raw body, before parsing it::

    from sandhub import verify_webhook

    if not verify_webhook(request.body, request.headers["Sandhub-Signature"], secret):
        return 400
"""

from __future__ import annotations

import hashlib
import hmac
import time


def verify_webhook(
    body: bytes | str,
    header: str,
    secret: str | bytes,
    tolerance_s: float = 300,
    *,
    now: float | None = None,
) -> bool:
    """Whether ``header`` signs ``body`` under ``secret`` with a timestamp
    within ``tolerance_s`` of ``now`` (default: the clock), against replays.
    Signatures are compared in constant time; any ``v1`` of the header may
    match (several are sent while a secret is being rotated)."""
    raw = body.encode() if isinstance(body, str) else bytes(body)
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1":
            signatures.append(value)
    if timestamp is None or not signatures:
        return False
    clock = time.time() if now is None else now
    if abs(clock - timestamp) > tolerance_s:
        return False
    expected = hmac.new(key, str(timestamp).encode() + b"." + raw, hashlib.sha256).hexdigest()
    # Every candidate is compared (no early exit), each in constant time.
    matched = False
    for candidate in signatures:
        matched |= hmac.compare_digest(expected, candidate)
    return matched
