"""The one base class of errors caused by the user's input (config, cohort, manifest, checkpoint, run folder).

The command line turns any `RaybenchError` into one `Error: ...` line and exit code 2 (the message names the
file, key or record and the fix); `--verbose` adds the traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class RaybenchError(Exception):
    """Bad input or a run folder in a state the user has to fix; the message says what and how."""


USER_EXIT_CODE = 2
