"""Schema fuzzing: schemathesis against the published ``/openapi.json`` of a running app,
with the ``model`` property pinned to the served model ids. Every 5xx is a failure.

    make run &                                              # serve_configs/local.yaml
    python -m benchmarks.fuzz_openapi [--url http://127.0.0.1:8000] [--cases 50]
        [--modes served,positive,negative] [--seed 31] [--max-tokens 8] [--max-n 4]
        [--api-key KEY] [--timeout 120] [--tag NAME] [--no-report]

Fetches the app's ``/openapi.json`` and ``GET /v1/models``, then rewrites the document
before generating anything (``pin``):

- the ``model`` property of every JSON request body becomes an enum of the served ids
  (every id on every endpoint: a chat completion to the embedding model is a case too),
  so generated requests reach the routing decision and the engines instead of stopping
  at the 404 for an unknown model;
- ``max_tokens`` becomes required and at most ``--max-tokens``, ``max_completion_tokens``
  and ``min_tokens`` at most the same, ``n`` and ``best_of`` at most ``--max-n``: the
  run finishes in minutes on 2 CPU cores (a schema-valid ``max_tokens`` of 2**31 or an
  unset one would make each case a full-context generation);
- the operations' ``security`` is dropped (schemathesis would otherwise send made-up
  bearer tokens, all 401): requests go anonymous — `make run`'s config serves them as
  tenant ``local`` — or with ``--api-key``.

For each operation and each generation mode, ``--cases`` cases from Hypothesis (seeded:
the same ``--seed`` and document give the same cases), sent one at a time. Modes:

- ``served``: bodies the schema allows, generated from the pinned document narrowed
  (``narrow``) to what the served models accept — without the documented parameters
  they refuse whatever the value (audio, ``functions``, media parts, …) and the shapes
  the server's validators refuse where the schema cannot say so; most of these reach
  an engine;
- ``positive``: bodies the pinned document allows, as published (most chat bodies
  carry some refused parameter: a 400 naming it);
- ``negative``: bodies it forbids (a 400 naming the parameter is expected; a 2xx is
  counted, not judged: pydantic's lax mode takes ``"5"`` for an integer, for one).

Each response is judged (``judge``):

- any 5xx (or no response within ``--timeout``) is a failure, printed with the request
  and the response body and its ``x-request-id`` (grep the server's log for it);
- a 4xx/5xx must be JSON of the one error shape ``{"error": {message, type, param,
  code}}``, all four keys present;
- the status must be one the operation documents, and a JSON response must conform to
  the schema documented for its status and media type (schemathesis's
  ``response_schema_conformance`` and ``content_type_conformance``);
- a stream (``text/event-stream``) must be ``data:`` events each conforming to the
  documented event schema, ending with ``data: [DONE]``, and carry no error event of
  type ``server_error`` (a 5xx after the stream began).

Not fuzzed yet (``NOT_FUZZED``): the Anthropic Messages operations, whose errors and
events have Anthropic's shapes, and the Responses operations, whose streams are named
events without ``data: [DONE]`` — ``judge`` knows neither; their bad input is covered by
tests/integration/test_exit_paths.py.

Exits 1 on any failure. Writes docs/benchmarks/fuzz-openapi-<date>[-TAG].md/.json/.png
(``--no-report``: none).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import hashlib
import json
import shlex
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.serving_lib import REPO, _version, environment

OUT = REPO / "docs" / "benchmarks"
JSON_MEDIA = "application/json"
SSE_MEDIA = "text/event-stream"
ERROR_KEYS = ("message", "type", "param", "code")
MODES = ("served", "positive", "negative")
# Integer properties that set how much work a request is, capped by --max-tokens.
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens")
# Integer properties that multiply it, capped by --max-n.
FANOUT_FIELDS = ("n", "best_of")


def log(message: str) -> None:
    print(f"[fuzz-openapi] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the document
# operations not judged here (module docstring)
NOT_FUZZED = ("POST /v1/messages", "POST /v1/responses", "GET /v1/responses",
              "DELETE /v1/responses")  # fmt: skip


def request_body_schemas(doc: dict[str, Any]) -> dict[str, str]:
    """``{"POST /v1/chat/completions": "ChatCompletionRequest", …}``: the component
    schema each operation's JSON request body refers to."""
    out = {}
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            ref = (op.get("requestBody", {}).get("content", {}).get(JSON_MEDIA, {})
                   .get("schema", {}).get("$ref", ""))  # fmt: skip
            if ref.startswith("#/components/schemas/"):
                out[f"{method.upper()} {path}"] = ref.rsplit("/", 1)[1]
    return out


def _cap(prop: dict[str, Any], maximum: int, *, nullable: bool = True) -> dict[str, Any]:
    """An integer property (plain, or ``anyOf`` an integer and null) with its maximum
    lowered to ``maximum``; ``nullable=False`` drops the null branch (and a null
    default)."""
    branches = prop.get("anyOf", [prop])
    out = []
    for b in branches:
        if b.get("type") == "integer":
            b = {**b, "maximum": min(b.get("maximum", maximum), maximum)}
            b["minimum"] = min(b.get("minimum", 0), b["maximum"])
        elif b.get("type") == "null" and not nullable:
            continue
        out.append(b)
    keep = {k: v for k, v in prop.items() if k not in ("anyOf", "type", "minimum", "maximum")}
    if not nullable and keep.get("default", 0) is None:
        del keep["default"]
    if len(out) == 1:
        return {**keep, **out[0]}
    return {**keep, "anyOf": out}


def pin(
    doc: dict[str, Any], model_ids: Iterable[str], *, max_tokens: int = 8, max_n: int = 4
) -> dict[str, Any]:
    """A copy of the published document to generate from: ``model`` pinned to the served
    ids, the work a request asks for capped, no security requirements (see the module
    docstring). The original is not changed."""
    ids = sorted(set(model_ids))
    if not ids:
        raise ValueError("no served model ids to pin `model` to")
    out = copy.deepcopy(doc)
    schemas = out.get("components", {}).get("schemas", {})
    for name in sorted(set(request_body_schemas(out).values())):
        schema = schemas[name]
        props = schema.get("properties", {})
        if "model" in props:
            props["model"] = {"type": "string", "enum": ids}
        for f in TOKEN_FIELDS:
            if f in props:
                props[f] = _cap(props[f], max_tokens, nullable=f != "max_tokens")
        if "max_tokens" in props and "max_tokens" not in schema.get("required", []):
            schema["required"] = [*schema.get("required", []), "max_tokens"]
        for f in FANOUT_FIELDS:
            if f in props:
                props[f] = _cap(props[f], max_n)
    for item in out.get("paths", {}).values():
        for op in item.values():
            if isinstance(op, dict):
                op.pop("security", None)
    out.pop("security", None)
    return out


# Documented request properties the served models refuse whatever their value (400
# ``unsupported_parameter``; app/api/protocol.py, app/api/messages.py), or refuse unless
# another property agrees (a tool message needs a tool_call_id; best_of must equal n).
REFUSED = {
    "ChatCompletionRequest": ("functions", "function_call", "audio", "prediction",
                              "web_search_options", "reasoning_effort", "verbosity",
                              "modalities", "store", "service_tier"),
    "CompletionRequest": ("echo", "suffix", "best_of", "store", "service_tier"),
    "ChatMessage": ("function_call", "audio", "tool_calls"),
}  # fmt: skip
REFUSED_PARTS = ("MediaPart",)  # image, audio and file content parts: text-only models
REFUSED_ROLES = ("tool",)


def _min_items(prop: dict[str, Any], *, max_items: int | None = None) -> dict[str, Any]:
    """Array branches of a property given ``minItems: 1`` (and ``maxItems``)."""
    for b in prop.get("anyOf", [prop]):
        if b.get("type") == "array":
            b["minItems"] = max(b.get("minItems", 0), 1)
            if max_items is not None and b.get("items", {}).get("type") == "string":
                b["maxItems"] = max_items
    return prop


def narrow(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of a pinned document without what the served models refuse whatever the
    value (``REFUSED``): generation from it (mode ``served``) reaches the engines far
    more often than from the published document, where most chat bodies carry some
    documented-but-refused parameter (an audio part, ``functions``) and end in a 400.
    Also what the server's validators refuse and the schema cannot say: more than one
    prompt per legacy completion, empty ``prompt``/``input`` arrays and stop strings,
    ``logit_bias`` keys that are not token ids, biases outside [-100, 100]."""
    out = copy.deepcopy(doc)
    schemas = out.get("components", {}).get("schemas", {})
    for name, props in REFUSED.items():
        for p in props:
            schemas.get(name, {}).get("properties", {}).pop(p, None)
    message = schemas.get("ChatMessage", {}).get("properties", {})
    if "role" in message:
        message["role"]["enum"] = [r for r in message["role"]["enum"] if r not in REFUSED_ROLES]
    for branch in message.get("content", {}).get("anyOf", []):
        items = branch.get("items", {})
        if "oneOf" in items:
            refs = [f"#/components/schemas/{n}" for n in REFUSED_PARTS]
            items["oneOf"] = [b for b in items["oneOf"] if b.get("$ref") not in refs]
            mapping = items.get("discriminator", {}).get("mapping", {})
            for k in [k for k, v in mapping.items() if v in refs]:
                del mapping[k]
    for name in set(request_body_schemas(out).values()):
        props = schemas[name].get("properties", {})
        for branch in props.get("logit_bias", {}).get("anyOf", []):
            if branch.get("type") == "object":  # token ids as keys
                branch["propertyNames"] = {"pattern": "^[0-9]{1,5}$"}
                branch["additionalProperties"] = {"type": "number", "minimum": -100,
                                                  "maximum": 100}  # fmt: skip
        for branch in props.get("stop", {}).get("anyOf", []):  # no empty stop strings
            target = branch.get("items", branch)
            if target.get("type") == "string":
                target["minLength"] = 1
    if "prompt" in schemas.get("CompletionRequest", {}).get("properties", {}):
        _min_items(schemas["CompletionRequest"]["properties"]["prompt"], max_items=1)
    if "input" in schemas.get("EmbeddingRequest", {}).get("properties", {}):
        _min_items(schemas["EmbeddingRequest"]["properties"]["input"])
    return out


def documented_statuses(doc: dict[str, Any]) -> dict[str, set[int]]:
    return {
        f"{method.upper()} {path}": {int(s) for s in op.get("responses", {}) if s.isdigit()}
        for path, item in doc.get("paths", {}).items()
        for method, op in item.items()
    }


def sse_schema(doc: dict[str, Any], operation: str) -> dict[str, Any] | None:
    """The documented schema of one event of the operation's 200 stream, with the
    document's components beside it so its ``$ref``s resolve."""
    method, path = operation.split(" ", 1)
    op = doc.get("paths", {}).get(path, {}).get(method.lower(), {})
    content = op.get("responses", {}).get("200", {}).get("content", {})
    schema = content.get(SSE_MEDIA, {}).get("schema")
    if schema is None:
        return None
    return {**schema, "components": doc.get("components", {})}


# --------------------------------------------------------------------------- judging
def error_shape_problem(body: Any) -> str | None:
    """None when ``body`` is the one error shape ``{"error": {message, type, param,
    code}}`` (message and type strings, param and code string or null), else what is
    wrong with it."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return "error body is not {'error': {...}}"
    err = body["error"]
    missing = [k for k in ERROR_KEYS if k not in err]
    if missing:
        return f"error body lacks {', '.join(missing)}"
    for k in ("message", "type"):
        if not isinstance(err[k], str):
            return f"error.{k} is not a string"
    for k in ("param", "code"):
        if err[k] is not None and not isinstance(err[k], str):
            return f"error.{k} is neither a string nor null"
    return None


def sse_events(text: str) -> tuple[list[str], bool]:
    """The ``data:`` payloads of a server-sent event stream, without the final
    ``[DONE]``, and whether that sentinel ended it."""
    events: list[str] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [
            line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")
        ]
        if data:
            events.append("\n".join(data))
    done = bool(events) and events[-1] == "[DONE]"
    return (events[:-1] if done else events), done


def sse_problems(text: str, validate: Callable[[Any], str | None]) -> list[str]:
    """What is wrong with a 200 stream: events that are not JSON or not of the
    documented schema (``validate`` returns the violation or None), an error event of
    type ``server_error``, a missing ``[DONE]``."""
    events, done = sse_events(text)
    problems = []
    for i, raw in enumerate(events):
        try:
            event = json.loads(raw)
        except ValueError:
            problems.append(f"stream event #{i} is not JSON: {raw[:120]!r}")
            continue
        violation = validate(event)
        if violation:
            problems.append(f"stream event #{i} violates the schema: {violation}")
        if isinstance(event, dict) and "error" in event:
            shape = error_shape_problem(event)
            if shape:
                problems.append(f"stream error event #{i}: {shape}")
            elif event["error"]["type"] == "server_error":
                problems.append(f"stream error event #{i} (server_error, a 5xx after the "
                                f"stream began): {event['error']['message']}")  # fmt: skip
    if not done:
        problems.append("stream does not end with data: [DONE]")
    return problems


def judge(
    status: int,
    content_type: str,
    text: str,
    documented: set[int],
    validate_sse: Callable[[Any], str | None] | None = None,
) -> list[str]:
    """The problems of one response, independent of schemathesis's own checks (which
    ``Fuzzer.send`` adds for JSON responses): 5xx, error shape, non-JSON errors, stream
    events. An empty list is a pass."""
    problems = []
    media = content_type.split(";")[0].strip().lower()
    if status >= 500:
        problems.append(f"{status}: server error")
    if status not in documented:
        problems.append(f"{status} is not a documented status of the operation")
    if status >= 400:
        if media != JSON_MEDIA:
            problems.append(f"{status} with content type {media or 'none'!r}, not the JSON "
                            "error shape")  # fmt: skip
        else:
            try:
                shape = error_shape_problem(json.loads(text))
            except ValueError:
                shape = "error body is not JSON"
            if shape:
                problems.append(f"{status}: {shape}")
    elif media == SSE_MEDIA and validate_sse is not None:
        problems += sse_problems(text, validate_sse)
    return problems


def is_server_error(problem: str) -> bool:
    """A problem that counts as a 5xx: the status, a server_error event in a stream,
    no response at all."""
    return (
        problem[:1] == "5"  # "500: server error", "504 is not a documented status …"
        or problem.startswith("no response")
        or (problem.startswith("stream error event") and "(server_error" in problem)
    )


# --------------------------------------------------------------------------- running
@dataclass
class Result:
    operation: str
    mode: str
    status: int | None  # None: no response
    elapsed_s: float
    problems: list[str]
    request: dict[str, Any] = field(default_factory=dict)
    response: str = ""
    request_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The case for the report's JSON: request and response in full only when it
        has a problem (the seed makes the others again), else the error code of a 4xx."""
        out: dict[str, Any] = {
            "operation": self.operation, "mode": self.mode, "status": self.status,
            "elapsed_s": round(self.elapsed_s, 3), "problems": self.problems,
            "request_id": self.request_id, "code": error_code(self.response),
        }  # fmt: skip
        if self.problems:
            out.update(request=self.request, response=self.response)
        return out


def error_code(text: str) -> str | None:
    """``error.code`` of an error body, None for anything else."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


class Fuzzer:
    def __init__(self, base_url: str, doc: dict[str, Any], api_key: str | None,
                 timeout: float) -> None:  # fmt: skip
        import jsonschema
        import requests
        import schemathesis

        self.base_url = base_url.rstrip("/")
        self.doc = doc
        # mode "served" generates from the narrowed document, the others from the pinned one
        self.schemas = {"published": schemathesis.openapi.from_dict(doc),
                        "served": schemathesis.openapi.from_dict(narrow(doc))}  # fmt: skip
        self.session = requests.Session()
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.documented = documented_statuses(doc)
        self.sse_validators: dict[str, Any] = {}
        for op in self.documented:
            s = sse_schema(doc, op)
            if s is not None:
                self.sse_validators[op] = jsonschema.Draft202012Validator(s)
        self.results: list[Result] = []

    def operations(self) -> list[str]:
        """The labels (``METHOD /path``) of the document's operations, in its order
        (the Anthropic and Responses ones left out: module docstring)."""
        return [op.label for op in self._operations("published")
                if not op.label.startswith(NOT_FUZZED)]  # fmt: skip

    def _operations(self, which: str) -> list[Any]:
        return [r.ok() for r in self.schemas[which].get_all_operations()]  # type: ignore[union-attr]

    def operation(self, label: str, mode: str) -> Any:
        which = "served" if mode == "served" else "published"
        return next(op for op in self._operations(which) if op.label == label)

    def _validate_sse(self, operation: str) -> Callable[[Any], str | None] | None:
        validator = self.sse_validators.get(operation)
        if validator is None:
            return None

        def validate(event: Any) -> str | None:
            err = next(iter(validator.iter_errors(event)), None)
            if err is None:
                return None
            where = "/".join(str(p) for p in err.absolute_path)
            return f"{err.message[:200]} (at /{where})"

        return validate

    def send(self, case: Any, mode: str) -> Result:
        import requests
        from schemathesis.checks import CheckFunction
        from schemathesis.core.failures import FailureGroup
        from schemathesis.specs.openapi import checks as oc

        label = case.operation.label
        kwargs = case.as_transport_kwargs(base_url=self.base_url, headers=self.headers)
        kwargs.pop("stream", None)
        request = {"method": kwargs.get("method"), "url": kwargs.get("url"),
                   "headers": {k: "Bearer KEY" if k.lower() == "authorization" else v
                               for k, v in (kwargs.get("headers") or {}).items()
                               if k.lower() != "user-agent"},
                   "body": _jsonable(kwargs["json"]) if "json" in kwargs
                   else kwargs.get("data")}  # fmt: skip
        if isinstance(request["body"], bytes):
            request["body"] = request["body"].decode("utf-8", "replace")
        start = time.monotonic()
        try:
            response = self.session.request(**kwargs, timeout=self.timeout)
        except requests.RequestException as exc:
            return Result(label, mode, None, time.monotonic() - start,
                          [f"no response: {type(exc).__name__}: {exc}"], request)  # fmt: skip
        elapsed = time.monotonic() - start
        content_type = response.headers.get("content-type", "")
        text = response.text
        problems = judge(response.status_code, content_type, text, self.documented[label],
                         self._validate_sse(label))  # fmt: skip
        if content_type.split(";")[0].strip().lower() == JSON_MEDIA:
            checks: list[CheckFunction] = [oc.response_schema_conformance,
                                           oc.content_type_conformance]  # fmt: skip
            try:
                case.validate_response(response, checks=checks)
            except FailureGroup as group:
                problems += [f"schemathesis: {f.title}: {f.message.strip()[:300]}"
                             for f in group.exceptions]  # fmt: skip
            except Exception as exc:  # a check that could not run is reported, not fatal
                problems.append(f"schemathesis check error: {type(exc).__name__}: {exc}")
        return Result(label, mode, response.status_code, elapsed, problems, request,
                      text[:4000], response.headers.get("x-request-id"))  # fmt: skip

    def run_operation(self, label: str, mode: str, cases: int, seed: int,
                      progress: Callable[[Result, int], None]) -> int:  # fmt: skip
        """Sends up to ``cases`` cases of one operation in one mode (``served``: positive
        cases of the narrowed document); returns how many.
        Fewer when Hypothesis runs out of distinct cases (an operation without inputs has
        one) or none can be made (negative mode of an operation without inputs)."""
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import seed as hseed
        from hypothesis.errors import Unsatisfiable
        from schemathesis import GenerationMode

        sent = 0
        operation = self.operation(label, mode)
        generation = GenerationMode("positive" if mode == "served" else mode)

        @hseed(seed)
        @settings(max_examples=cases, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False)  # fmt: skip
        @given(case=operation.as_strategy(generation_mode=generation))
        def one(case: Any) -> None:
            nonlocal sent
            result = self.send(case, mode)
            self.results.append(result)
            sent += 1
            progress(result, sent)

        with contextlib.suppress(Unsatisfiable):
            one()
        return sent


# --------------------------------------------------------------------------- summary
def tally(results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Counts by operation, mode and status; problems by kind; the 5xx."""
    by_op: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    codes: dict[str, Counter[str]] = defaultdict(Counter)
    kinds: Counter[str] = Counter()
    server_errors, with_problems, cases = 0, 0, 0
    for r in results:
        cases += 1
        with_problems += bool(r["problems"])
        status = "none" if r["status"] is None else str(r["status"])
        by_op[r["operation"]][r["mode"]][status] += 1
        if r["status"] is not None and r["status"] >= 400:
            codes[r["operation"]][f"{r['status']} {r.get('code')}"] += 1
        for p in r["problems"]:
            kinds[problem_kind(p)] += 1
        server_errors += any(is_server_error(p) for p in r["problems"])
    return {
        "cases": cases,
        "by_operation": {
            op: {m: dict(sorted(c.items())) for m, c in modes.items()}
            for op, modes in by_op.items()
        },
        "error_codes": {op: dict(c.most_common()) for op, c in codes.items()},
        "problem_kinds": dict(kinds.most_common()),
        "server_errors": server_errors,
        "cases_with_problems": with_problems,
    }


def problem_kind(problem: str) -> str:
    """A problem without its particulars, to count alike ones together."""
    if problem.startswith("schemathesis: "):
        return problem.split(":", 2)[0] + ": " + problem.split(":", 2)[1].strip()
    if problem.startswith("stream event #"):
        return "stream event " + problem.split(": ", 1)[0].split(" ", 3)[-1]
    if problem.startswith("stream error event #"):
        return "stream error event" + (" (server_error)" if "server_error" in problem else "")
    if problem.startswith("no response"):
        return problem.split(":", 2)[0] + ": " + problem.split(":", 2)[1].strip()
    return problem.split(" (", 1)[0]


# --------------------------------------------------------------------------- report
def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(op, mode, counts) for op, modes in summary["by_operation"].items()
            for mode, counts in modes.items()]  # fmt: skip
    statuses = sorted({s for _, _, c in rows for s in c}, key=lambda s: (s == "none", s))
    colour = {s: ("tab:green" if s.startswith("2") else "tab:red" if s[0] in "5n"
                  else plt.get_cmap("tab20")(i % 20))
              for i, s in enumerate(statuses)}  # fmt: skip
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    labels = [f"{op} [{mode[:3]}]" for op, mode, _ in rows]
    left = [0] * len(rows)
    for s in statuses:
        vals = [c.get(s, 0) for _, _, c in rows]
        ax.barh(labels, vals, left=left, color=colour[s], label=s)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("cases")
    ax.set_title("responses by status, per operation and generation mode")
    ax.legend(title="status", loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _md(text: str, limit: int = 600) -> str:
    text = text if len(text) <= limit else text[:limit] + " …"
    return text.replace("```", "ʼʼʼ")


def report(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    statuses = sorted({st for modes in s["by_operation"].values() for c in modes.values()
                       for st in c}, key=lambda st: (st == "none", st))  # fmt: skip
    verdict = ("**0 5xx**" if s["server_errors"] == 0
               else f"**{s['server_errors']} case(s) with a 5xx**")  # fmt: skip
    lines = [
        f"# Schema fuzzing of /openapi.json — {doc['date']}", "",
        f"`python -m benchmarks.fuzz_openapi {doc['argv']}` against {doc['base_url']} "
        f"({doc['server']}): schemathesis {doc['environment']['versions'].get('schemathesis')} "
        "(Hypothesis "
        f"{doc['environment']['versions'].get('hypothesis')}) generating from the app's own "
        f"`/openapi.json`, `model` pinned to the served ids ({', '.join(doc['models'])}), "
        f"`max_tokens` required and ≤ {doc['max_tokens']}, `n`/`best_of` ≤ {doc['max_n']}, "
        f"up to {doc['cases_per_operation']} cases per operation and mode "
        f"({', '.join(doc['modes'])}), seed {doc['seed']}, sent one at a time "
        f"{'with an API key' if doc['api_key'] else 'without credentials (anonymous tenant)'}."
        " How the document is pinned and what is judged: the module docstring of "
        "`benchmarks/fuzz_openapi.py`.", "",
        f"Result: {s['cases']} cases in {doc['wall_s']:.0f} s, {verdict}, "
        f"{s['cases_with_problems']} case(s) with any problem.", "",
        "| operation | mode | cases | " + " | ".join(statuses) + " |",
        "|---|---|---|" + "---|" * len(statuses),
    ]  # fmt: skip
    for op, modes in s["by_operation"].items():
        for mode, counts in modes.items():
            lines.append(
                f"| `{op}` | {mode} | {sum(counts.values())} | "
                + " | ".join(str(counts.get(st, "")) for st in statuses)
                + " |"
            )
    lines += ["", f"![status counts]({doc['image']})", ""]
    lines += ["## Refusals by status and `error.code`", "",
              "| operation | status and code: cases |", "|---|---|"]  # fmt: skip
    for op, c in s.get("error_codes", {}).items():
        lines.append(f"| `{op}` | " + ", ".join(f"{k}: {n}" for k, n in c.items()) + " |")
    lines += ["", "## Problems by kind", ""]
    if s["problem_kinds"]:
        lines += ["| kind | cases |", "|---|---|"]
        lines += [f"| {_md(k, 200)} | {n} |" for k, n in s["problem_kinds"].items()]
    else:
        lines.append("None.")
    failures = [r for r in doc["results"] if r["problems"]]
    lines += ["", "## Cases with problems", ""]
    if not failures:
        lines.append("None.")
    shown: Counter[str] = Counter()
    for r in failures:
        key = r["operation"] + " " + " / ".join(sorted({problem_kind(p) for p in r["problems"]}))
        shown[key] += 1
        if shown[key] > 3:  # the rest are in the JSON
            continue
        lines += [
            f"### `{r['operation']}` ({r['mode']}) → {r['status']}"
            + (f", request id `{r['request_id']}`" if r["request_id"] else ""), "",
            *[f"- {_md(p, 400)}" for p in r["problems"]], "",
            "```json", _md(json.dumps(r["request"], ensure_ascii=True), 2000), "```", "",
            "Response:", "", "```", _md(r["response"], 1500), "```", "",
        ]  # fmt: skip
    more = {k: n - 3 for k, n in shown.items() if n > 3}
    if more:
        lines += ["More of the same kind (all in the JSON): "
                  + "; ".join(f"{k}: {n}" for k, n in more.items()), ""]  # fmt: skip
    lines += [
        "", "## Re-run", "",
        "```", "make run    # serve_configs/local.yaml; wait for 'Deployed app'",
        f".venv/bin/python -m benchmarks.fuzz_openapi {doc['argv']}".rstrip(), "```", "",
        "## Environment", "", "```json", json.dumps(doc["environment"], indent=1), "```", "",
    ]  # fmt: skip
    return "\n".join(lines)


def git_dirty_paths() -> list[str]:
    try:
        out = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line[3:] for line in out.splitlines() if line.strip()]


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    import requests

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the running app")
    parser.add_argument("--cases", type=int, default=50, help="per operation and mode")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-n", type=int, default=4)
    parser.add_argument(
        "--api-key",
        default=None,
        help="sent as a bearer token (default: none, the anonymous tenant)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    parser.add_argument(
        "--operations",
        default="",
        help="comma-separated substrings of 'METHOD /path' to fuzz (default all)",
    )
    parser.add_argument(
        "--server",
        default="make run (serve_configs/local.yaml)",
        help="how the app was started, for the report",
    )
    parser.add_argument("--tag", default="", help="appended to the report's file name")
    parser.add_argument("--no-report", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    argv_text = shlex.join(argv or sys.argv[1:])
    if args.api_key:  # never written into a report
        argv_text = argv_text.replace(args.api_key, "KEY")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: {args.modes!r}; choose from {', '.join(MODES)}")

    base = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        published = requests.get(f"{base}/openapi.json", timeout=30).json()
        listed = requests.get(f"{base}/v1/models", headers=headers, timeout=30)
        listed.raise_for_status()
    except (requests.RequestException, ValueError) as exc:
        log(f"cannot read {base}/openapi.json and /v1/models ({exc}); is the app running "
            "(`make run`)?")  # fmt: skip
        return 2
    models = [m["id"] for m in listed.json()["data"]]
    digest = hashlib.sha256(json.dumps(published, sort_keys=True).encode()).hexdigest()
    log(f"{base}: {len(published.get('paths', {}))} paths, models {', '.join(models)}")
    doc = pin(published, models, max_tokens=args.max_tokens, max_n=args.max_n)
    fuzzer = Fuzzer(base, doc, args.api_key, args.timeout)
    wanted = [w.strip() for w in args.operations.split(",") if w.strip()]
    operations = [op for op in fuzzer.operations()
                  if not wanted or any(w in op for w in wanted)]  # fmt: skip
    total = len(operations) * len(modes) * args.cases
    log(f"{len(operations)} operations × {len(modes)} modes × up to {args.cases} cases "
        f"(≤ {total})")  # fmt: skip
    start = time.monotonic()

    for i, operation in enumerate(operations, 1):
        for mode in modes:
            t0 = time.monotonic()
            statuses: Counter[str] = Counter()

            def progress(
                r: Result, n: int, statuses: Counter[str] = statuses, mode: str = mode
            ) -> None:
                statuses[str(r.status)] += 1
                if r.problems and any(is_server_error(p) for p in r.problems):
                    log(f"  5xx: {r.operation} → {r.status} (request id {r.request_id})\n"
                        f"    request: {json.dumps(r.request, ensure_ascii=True)[:2000]}\n"
                        f"    response: {r.response[:1000]}")  # fmt: skip
                elif r.problems:
                    log(f"  problem: {r.operation} → {r.status}: {'; '.join(r.problems)[:300]}")
                if n % 10 == 0:
                    log(
                        f"  {r.operation} {mode}: {n}/{args.cases} "
                        f"({len(fuzzer.results)} sent, {time.monotonic() - start:.0f} s)"
                    )

            log(f"[{i}/{len(operations)}] {operation} ({mode})")
            n = fuzzer.run_operation(operation, mode, args.cases, args.seed, progress)
            log(f"  {n} cases in {time.monotonic() - t0:.0f} s: "
                + ", ".join(f"{k}×{v}" for k, v in sorted(statuses.items())))  # fmt: skip

    wall = time.monotonic() - start
    results = [r.to_json() for r in fuzzer.results]
    summary = tally(results)
    log(f"{summary['cases']} cases in {wall:.0f} s: {summary['server_errors']} with a 5xx, "
        f"{summary['cases_with_problems']} with any problem")  # fmt: skip
    for kind, n in summary["problem_kinds"].items():
        log(f"  {n} × {kind}")
    if not args.no_report:
        date = dt.date.today().isoformat()
        stem = f"fuzz-openapi-{date}" + (f"-{args.tag}" if args.tag else "")
        env = environment()
        env["versions"].update({d: _version(d) for d in ("schemathesis", "hypothesis",
                                                          "requests")})  # fmt: skip
        env["git_dirty_paths"] = git_dirty_paths()
        out = {"argv": argv_text, "date": date, "base_url": base, "server": args.server,
               "models": models, "openapi_sha256": digest, "modes": modes,
               "cases_per_operation": args.cases, "seed": args.seed,
               "max_tokens": args.max_tokens, "max_n": args.max_n,
               "api_key": bool(args.api_key), "wall_s": wall, "environment": env,
               "image": f"{stem}.png", "summary": summary, "results": results}  # fmt: skip
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{stem}.json").write_text(json.dumps(out, indent=1))
        plot(summary, OUT / f"{stem}.png")
        (OUT / f"{stem}.md").write_text(report(out))
        log(f"wrote {OUT / stem}.md")
    return 1 if summary["cases_with_problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
