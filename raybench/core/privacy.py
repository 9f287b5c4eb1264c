"""Failure text that may enter a persisted artifact, for cohorts whose record identifiers must stay put.

A failure message often names records: a pandas KeyError lists the ecg_ids (MIMIC study ids) it could not
find, a traceback line quotes a path with the subject id in it. For credentialed cohorts (MIMIC-IV-ECG) such
text must not reach the cells table, tables/missing, audit.json, report.html or any other artifact that may
be shared, so every place that persists failure text goes through `failure_text`:

    reason = failure_text(err, is_credentialed(cfg))   # err: an exception, or text such as a traceback

Open cohorts keep the exception type and the last line of the message (as before); credentialed cohorts
keep only the exception type and how many identifier-like values the message held, e.g.
`KeyError (message withheld: credentialed cohort; 3 identifier-like values)`. What may leave the environment
at all is decided by `raybench export` (raybench/app/export.py).
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping
from typing import Any

# cohort kinds whose record identifiers must not leave the environment; `wfdb` unless its config says
# `cohort.credentialed: false` (open data)
CREDENTIALED_KINDS = frozenset({"mimic", "wfdb"})
WITHHELD = "message withheld: credentialed cohort"
MESSAGE_LIMIT = 300

# A value that can identify a record: a token with 4+ digits in it (study/subject ids, p1000/p1000xxxx folder
# names, s4001xxxx study folders; not dtype names like int64). Counted, never kept.
_TOKEN = re.compile(r"[\w-]+")
_TYPE_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:\([\w.]+\))?)\s*(?::|$)")
# What may stand as the "type" of credentialed free text: a dotted exception class name (wfdb.io.Error,
# KeyboardInterrupt), never a leading token of the message itself (`s40689238: header missing`).
_TYPE_NAME = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*")
_TYPE_SUFFIXES = ("Error", "Exception", "Warning", "Interrupt", "Exit", "Failure", "Timeout", "Iteration")
_REDUCED = re.compile(rf"(?:failed: )?(\S+) \({re.escape(WITHHELD)}; \d+ identifier-like values?\)")


def is_credentialed(cfg: Any) -> bool:
    """Whether a run's cohort is credentialed. Accepts a RunConfig, a CohortConfig, a run.yaml mapping or a
    cohort kind; anything without a cohort kind counts as open. A `wfdb` cohort is credentialed unless its
    config (not a bare kind) says `credentialed: false`."""
    kind: Any = cfg
    flag: Any = True
    if isinstance(cfg, Mapping):
        cohort = cfg.get("cohort")
        if not isinstance(cohort, Mapping):
            cohort = next((h.get("cohort") for h in (cfg.get("config"), cfg.get("run_config"), cfg.get("resolved"))
                           if isinstance(h, Mapping) and isinstance(h.get("cohort"), Mapping)), None)
        section = cohort if isinstance(cohort, Mapping) else cfg
        kind, flag = section.get("kind"), section.get("credentialed", True)
    elif hasattr(cfg, "cohort"):
        kind, flag = getattr(cfg.cohort, "kind", None), getattr(cfg.cohort, "credentialed", True)
    elif hasattr(cfg, "kind"):
        kind, flag = cfg.kind, getattr(cfg, "credentialed", True)
    if not isinstance(kind, str) or kind.lower() not in CREDENTIALED_KINDS:
        return False
    return kind.lower() != "wfdb" or flag is not False


def failure_text(exc_or_msg: BaseException | str | None, credentialed: bool, *, limit: int = MESSAGE_LIMIT) -> str:
    """One line describing a failure, safe to persist for the cohort (see the module doc).

    An exception gives `Type: last line of its message`; text (e.g. a formatted traceback, or a reason
    written earlier) gives its last non-empty line. Credentialed: `Type (message withheld: credentialed
    cohort; N identifier-like values)` - the message itself is dropped; N counts the values in the exception's
    own message (the last line of a traceback). Text keeps its leading `Type:` only when that is an exception
    class name (`is_exception_type_name`), else `Error` stands for it. Text already reduced this way is
    returned unchanged, so applying the helper twice is harmless.
    """
    if exc_or_msg is None:
        return "unknown failure"
    if isinstance(exc_or_msg, BaseException):
        message = str(exc_or_msg).strip()
        if not credentialed:
            last = message.splitlines()[-1] if message else ""
            return f"{type(exc_or_msg).__name__}: {last[:limit]}"
        cause = _root_exception(exc_or_msg)
        name = type(cause).__name__
        return _withheld(name if not id_like_count(name) else "Error", str(cause))
    text = str(exc_or_msg).strip()
    reduced = _REDUCED.fullmatch(text)
    if reduced and (reduced.group(1) == "Error" or is_exception_type_name(reduced.group(1))):
        return text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    if not credentialed:
        return last[:limit] or "unknown failure"
    head = last[len("failed:"):].strip() if last.startswith("failed:") else last
    match = _TYPE_LINE.match(head)
    name = match.group(1) if match else ""
    inner = re.fullmatch(r"[\w.]+\(([\w.]+)\)", name)  # RayTaskError(KeyError) -> KeyError
    name = inner.group(1) if inner else name
    if not is_exception_type_name(name):  # the whole line is message: any id in it is counted, none kept
        return _withheld("Error", head)
    return _withheld(name, head[match.end():])


def is_exception_type_name(name: str) -> bool:
    """Whether `name` reads as an exception class (ValueError, wfdb.io.Error, StopIteration) and holds no
    identifier-like value, so it may be kept in a credentialed cohort's failure text."""
    if not _TYPE_NAME.fullmatch(name) or id_like_count(name):
        return False
    last = name.rsplit(".", 1)[-1]
    builtin = getattr(builtins, last, None)
    return last.endswith(_TYPE_SUFFIXES) or (isinstance(builtin, type) and issubclass(builtin, BaseException))


def id_like_count(text: str) -> int:
    """How many distinct identifier-like values `text` holds (what a withheld message reports)."""
    return len({t for t in _TOKEN.findall(text) if sum(ch.isdigit() for ch in t) >= 4})


def _withheld(type_name: str, message: str) -> str:
    n = id_like_count(message)
    return f"{type_name[:80]} ({WITHHELD}; {n} identifier-like value{'' if n == 1 else 's'})"


def _root_exception(exc: BaseException) -> BaseException:
    """The user's exception inside Ray's wrappers (RayTaskError.cause, TuneError's __cause__)."""
    for _ in range(8):
        inner = getattr(exc, "cause", None)
        if not isinstance(inner, BaseException) and type(exc).__name__.startswith(("RayTaskError", "TuneError")):
            inner = exc.__cause__
        if not isinstance(inner, BaseException) or inner is exc:
            return exc
        exc = inner
    return exc
