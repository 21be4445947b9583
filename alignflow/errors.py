"""The one error type callers can rely on to mean "the input is at fault, not alignflow".

Bad data, a setting the model or data cannot honour, an unusable model folder, a run that
diverged: the message names the file, row, field, setting or step, and that is all a user
needs to fix it. The CLI prints such errors alone (the traceback goes to the log file);
any other exception is a fault in alignflow and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """A run stopped by what it was given (data, config, model), with a message naming it."""


class DataCheckStop(RuntimeError):
    """A check on new data stopped the run before training; ``reason`` is its stable code and
    ``report_path`` the JSON report that names the rows (the flow records both on the run)."""

    reason = "data_check"
    report_words = "report:"  # how the message points at the report

    def __init__(self, message: str, report_path: str | None = None):
        where = f" ({self.report_words} {report_path})" if report_path else ""
        super().__init__(f"{self.reason}: {message}{where}")
        self.report_path = report_path


class CannotJudge(DataCheckStop):
    """No judge shown competent on some of the new data: an unattended run must not train on it.
    ``data add --accept-unjudged REASON`` versions it anyway, with the reason on the version."""

    reason = "cannot_judge"
    report_words = "pairs in"

    def __init__(self, message: str, report_path: str | None = None, summary: str | None = None):
        super().__init__(message, report_path)
        self.summary = summary or message  # what was left unjudged, without the way on or a path
