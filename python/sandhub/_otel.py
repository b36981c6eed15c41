"""The caller's OpenTelemetry context as W3C headers (issue #30 §5).

With ``opentelemetry-api`` installed (``pip install sandhub[otel]``), the
native layer calls :data:`current_context` at the start of every SDK call and
sends what it returns (``traceparent``, ``tracestate``) with the call's hub
requests, so the hub's spans join the caller's trace. The context is read
through the globally configured propagator, on the calling thread, inside
the caller's ``contextvars`` (for ``AsyncHub``: the calling task's).
Without the package, :data:`current_context` is ``None`` and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["current_context"]

#: The headers to send for the current context, or ``None`` when there is
#: no valid span; ``None`` itself when ``opentelemetry-api`` is missing.
current_context: Callable[[], list[tuple[str, str]] | None] | None

_SENT = ("traceparent", "tracestate")

try:
    from opentelemetry import propagate as _propagate
except ImportError:  # the `otel` extra is not installed
    current_context = None
else:

    def _current() -> list[tuple[str, str]] | None:
        carrier: dict[str, str] = {}
        _propagate.inject(carrier)
        pairs = [(k, v) for k, v in carrier.items() if k in _SENT]
        return pairs or None

    current_context = _current
