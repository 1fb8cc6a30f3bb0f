"""Serve's HAProxy as Switchyard ships it: its stats page and Prometheus exporter on
loopback only, and the errors HAProxy answers itself in the API's error shape.

Ray 2.60's HAProxy template binds the side listeners on every interface (``listen
stats`` → ``bind *:<RAY_SERVE_HAPROXY_STATS_PORT>``, ``frontend prometheus`` → ``bind
:<RAY_SERVE_HAPROXY_METRICS_PORT>``) with no knob for their address, and HAProxy's own
answers — a request it cannot read, one that did not arrive in time, no replica to take
it — are HAProxy's HTML pages or Ray's plain-text 500. Ray's supported knob is the binary it runs,
``RAY_SERVE_HAPROXY_BINARY_PATH``: ``switchyard serve`` points it at a small shell
wrapper that edits the config file Ray has just written (``-f FILE``) with a generated
``sed`` script and then ``exec``s the real binary with the same arguments — same pid,
same command line after the exec, so Serve's start, reload (``-sf``) and process checks
work as before. The script:

- rewrites exactly the two side bind lines to ``127.0.0.1`` (the API frontend follows
  ``http_options.host``);
- adds ``errorfile`` lines to the ``defaults`` section for HAProxy's own 400, 408, 413,
  500 and 501, and points Ray's per-backend 502/503/504 error file (Ray's plain-text 500
  for all three) at ours: each an ``{"error": {message, type, param, code}}`` JSON body
  with the right status, and ``Retry-After`` on the retryable ones;
- turns Ray's ``default_backend`` answer for a path no application serves — a
  plain-text 404, which is what every request gets while the app starts or drains
  under a SIGTERM — into a retryable 503 ``not_ready`` with ``Retry-After``;
- adds ``timeout http-request`` (the settings' ``header_timeout_s``) to ``defaults``:
  Ray sets none, so HAProxy held a connection whose headers never complete for its
  client timeout (3,600 s). Behind HAProxy the replicas only see complete header
  blocks, so this is the front's header deadline (the proxy guard's own applies on
  Ray's Python proxy).

Not in the API's shape, and not configurable in HAProxy 2.8: what its HTTP/1 layer
answers before a request exists — an unparsable request line or header block, a header
block over its 16 KiB buffer (400) and headers not complete in time (408). That layer
(``mux_h1.c``, ``h1_send_error``) writes HAProxy's built-in page whatever the error files
say (the only other choice is an empty answer). Everything after the header block —
body size and deadline, request id, header checks, credentials — is the proxy guard's,
which Ray runs on the replicas' own HTTP servers too (direct ingress applies
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``), so it answers in the API's shape on
both fronts.

``tests/unit/test_cli_haproxy_bind.py`` runs the real binary through it and renders
Ray's own template's lines, so a Ray upgrade that changes them fails there.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from app.api.proxy_guard import no_app_body

WRAPPER_NAME = "haproxy"
SED_NAME = "switchyard-haproxy.sed"

# status: (reason, type, code, message, retry-after seconds or None)
ERRORS: dict[int, tuple[str, str, str, str, int | None]] = {
    400: ("Bad Request", "invalid_request_error", "invalid_request",
          "The request could not be read: malformed, or its headers exceed the front's "
          "16 KiB buffer.", None),
    408: ("Request Timeout", "invalid_request_error", "request_timeout",
          "The request did not arrive in time.", None),
    413: ("Payload Too Large", "invalid_request_error", "request_too_large",
          "The request is too large.", None),
    500: ("Internal Server Error", "server_error", "internal_error",
          "The front could not handle the request.", None),
    501: ("Not Implemented", "invalid_request_error", "not_implemented",
          "The front does not implement this request.", None),
    502: ("Bad Gateway", "server_error", "upstream_error",
          "The serving replica failed to answer; retry.", 5),
    503: ("Service Unavailable", "server_error", "not_ready",
          "No replica can take the request right now (starting, stopping or overloaded); "
          "retry.", 5),
    504: ("Gateway Timeout", "server_error", "upstream_timeout",
          "The serving replica did not answer in time; retry.", 5),
}  # fmt: skip
DEFAULTS_ERRORS = (400, 408, 413, 500, 501)  # HAProxy's own: added to `defaults`
BACKEND_ERRORS = (502, 503, 504)  # Ray sets these per backend: repointed at ours

_WRAPPER = """#!/bin/sh
# Written by switchyard serve (app/cli/haproxy_bind.py): Serve's HAProxy with its stats
# and metrics listeners on 127.0.0.1 and its own errors in the API's error shape.
cfg=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "-f" ]; then cfg="$arg"; fi
  prev="$arg"
done
if [ -n "$cfg" ] && [ -f "$cfg" ]; then
  sed -i -E -f {script} "$cfg"
fi
exec {binary} "$@"
"""


def error_response(status: int) -> bytes:
    """The raw HTTP response HAProxy sends for ``status`` (an ``errorfile``)."""
    reason, kind, code, message, retry = ERRORS[status]
    body = json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}
    ).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-cache",
        "Connection: close",
        *([f"Retry-After: {retry}"] if retry is not None else []),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


NO_APP_BODY = "no-app.json"
# Ray's default backend: what a path no application serves gets (plain-text 404)
RAY_NO_APP = 'http-request return status 404 content-type text/plain lf-string "Path '


def sed_script(ports: tuple[int, ...], errors_dir: Path, header_timeout_s: float) -> str:
    alternatives = "|".join(str(int(p)) for p in ports)
    lines = [f"s/^([[:space:]]*bind )\\*?:({alternatives})[[:space:]]*$/\\1127.0.0.1:\\2/"]
    added = "".join(f"\\n    errorfile {s} {errors_dir}/{s}.http" for s in DEFAULTS_ERRORS)
    added += f"\\n    timeout http-request {max(1, round(header_timeout_s * 1000))}ms"
    lines.append(f"s#^defaults[[:space:]]*$#defaults{added}#")
    codes = "|".join(str(s) for s in BACKEND_ERRORS)
    lines.append(f"s#^([[:space:]]*errorfile )({codes}) .*$#\\1\\2 {errors_dir}/\\2.http#")
    no_app = (f"http-request return status 503 content-type application/json "
              f"hdr retry-after 5 file {errors_dir}/{NO_APP_BODY}")  # fmt: skip
    lines.append(f"s#^([[:space:]]*){RAY_NO_APP}.*$#\\1{no_app}#")
    return "\n".join(lines) + "\n"


def real_haproxy() -> str:
    """The binary Serve would run without the wrapper (Ray's own resolution)."""
    from ray.serve._private.haproxy import get_haproxy_binary

    return get_haproxy_binary()


def write_wrapper(
    directory: Path, binary: str, ports: tuple[int, ...], header_timeout_s: float
) -> Path:
    """The wrapper, its sed script and the error files in ``directory`` (the caller's
    private directory); returns the wrapper's path."""
    for status in ERRORS:
        (directory / f"{status}.http").write_bytes(error_response(status))
    (directory / NO_APP_BODY).write_bytes(no_app_body())
    script = directory / SED_NAME
    script.write_text(sed_script(ports, directory, header_timeout_s))
    path = directory / WRAPPER_NAME
    path.write_text(_WRAPPER.format(script=shlex.quote(str(script)), binary=shlex.quote(binary)))
    path.chmod(0o700)
    return path
