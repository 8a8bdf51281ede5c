"""Bearer-token authentication of the HTTP API (the admin and result pages keep Django's auth).

`Authorization: Bearer <token>` must carry one of LOOM_API_TOKENS. LOOM_API_AUTH=false turns the
check off; that is meant for a local benchmark only, and serve_api says so loudly when it happens.
"""

from __future__ import annotations

import hmac

from journal import conf
from loomapi.errors import Unauthorized

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="loom"'}


def authenticate(request) -> None:
    """Return if the request may use the API; raise Unauthorized (401) otherwise."""
    if not conf.get("LOOM_API_AUTH"):
        return
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'", headers=_CHALLENGE)
    offered = token.strip().encode()
    # compare_digest against every configured token (no early exit): the time taken does not
    # reveal how much of a token matched.
    accepted = False
    for candidate in conf.get("LOOM_API_TOKENS"):
        accepted |= hmac.compare_digest(offered, str(candidate).encode())
    if not accepted:
        raise Unauthorized("bearer token not accepted", headers=_CHALLENGE)
