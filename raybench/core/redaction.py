"""Credentials out of config that is rendered or exported (report.html, the exported run.yaml).

A config may carry secrets inside URIs: `tracking.mlflow.uri: https://user:pass@host`, a storage URI with a
signed query (`s3://bucket/run?access_key=...`). The run folder's own run.yaml keeps them (reruns need them), but
every copy meant to be read by others goes through `redact_text` / `redact_config`, which drop a URI's userinfo
(`user:pass@`), query string and fragment and keep scheme, host, port and path: enough to tell where a run
logged, nothing to log in with. A URI is split as RFC 3986 parses it (scheme, `//`, userinfo up to the last `@` of
the authority, host, path, query, fragment), so every character RFC 3986 allows in userinfo is cut with it.
"""

from __future__ import annotations

import html
import re
from typing import Any

# RFC 3986 userinfo: unreserved (ALPHA DIGIT - . _ ~), pct-encoded (%HH), sub-delims (! $ & ' ( ) * + , ; =) and ":";
# also an unencoded @, ? or # that a password may hold. It ends at the last @ before the authority's end (a "/",
# whitespace, a double quote, angle bracket or backtick), so a single quote inside a password stays in it.
_USERINFO = r"(?:[^\s/\"<>`]*@)?"
# the rest (host, port, path, query, fragment) stops at whitespace, double quotes, angle brackets, backticks, and at a
# single quote that closes a quoted string (one followed by the end, whitespace or YAML/JSON/Python punctuation)
_REST = r"(?:[^\s'\"<>`]|'(?![\s,;:)\]}'\"<>`]|$))*"
_URI = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://" + _USERINFO + _REST)


def redact_uri(uri: str) -> str:
    """`uri` without userinfo, query and fragment: `https://u:p@h:1/x?t=1#f` -> `https://h:1/x`."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    authority, slash, path = rest.partition("/")
    if "@" in authority:  # the last @ before the path: a password may hold an unencoded @, ? or #
        authority = authority.rsplit("@", 1)[1]
    return re.split(r"[?#]", f"{scheme}://{authority}{slash}{path}", maxsplit=1)[0]


def redact_text(text: str) -> str:
    """`text` with every URI in it redacted (`redact_uri`); everything else unchanged."""
    return _URI.sub(lambda m: redact_uri(m.group(0)), text)


def uri_secrets(text: str) -> set[bytes]:
    """What `redact_text` cuts out of the URIs in `text` (each `user:pass@`, each `?query#fragment`), as bytes:
    an exported file holding one of them (e.g. a report rendered before redaction) leaks it. Each also as HTML
    escapes it."""
    cuts: set[str] = set()
    for uri in _URI.findall(text):
        rest = uri.partition("://")[2]
        authority = rest.partition("/")[0]
        userinfo, at, _ = authority.rpartition("@")
        if at:
            cuts.add(userinfo + at)
            rest = rest[len(userinfo) + 1:]
        cut = re.search(r"[?#].+", rest)
        if cut:
            cuts.add(cut.group(0))
    return {form.encode() for c in cuts for form in (c, html.escape(c))}


def redact_config(obj: Any) -> Any:
    """A copy of a nested config (mappings, lists, tuples) with every string value redacted (`redact_text`)."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        return {k: redact_config(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(redact_config(v) for v in obj)
    return obj
