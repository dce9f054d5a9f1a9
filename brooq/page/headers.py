"""The response headers every status page carries.

The Content-Security-Policy allows exactly what the pages use: one inline stylesheet,
by its SHA-256 (brooq.page.render.STYLE), and forms posting to the page's own origin.
No script, no external resource, no framing (clickjacking), no <base> rewriting.

Owns: the policy and the other security headers, as a list the server writes out.
Must never: allow 'unsafe-inline', a script, or any origin other than 'self'.
"""

from __future__ import annotations

import base64
import hashlib

from brooq.page.render import STYLE

STYLE_HASH = "sha256-" + base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()

CSP = "; ".join(
    (
        "default-src 'none'",
        f"style-src '{STYLE_HASH}'",
        "img-src data:",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)


def security_headers() -> list[tuple[str, str]]:
    """The headers of every page (errors included), besides Content-Type and length."""
    return [
        ("Content-Security-Policy", CSP),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"),  # frame-ancestors for browsers without CSP 2
        ("Referrer-Policy", "no-referrer"),  # job ids in URLs stay on this origin
        ("Cache-Control", "no-store"),  # payloads and errors are not for caches
    ]
