"""Reports: finished runs from the run store → paper-shaped Markdown tables and plots.

:mod:`secure_fl.report.core` holds the API (loading runs, :class:`RunRecord`, the table
registry :data:`TABLES` with :func:`register_table`, Markdown/statistics/plot helpers);
every other module of this package is a formatter plug-in for one paper's tables
(``fedshift``, ``climb``, ``ratio_loss``, ...), imported on first use by :func:`get_table`
or all at once by :func:`load_plugins`. ``secure-fl report`` is the command-line face.
"""

from secure_fl.report.core import (
    METHOD_LABELS,
    METRICS,
    TABLES,
    MissingRunsError,
    ReportError,
    RunRecord,
    TableContext,
    TableReport,
    TableSpec,
    build_report,
    format_mean_std,
    format_percent,
    get_table,
    group_runs,
    load_plugins,
    load_runs,
    markdown_table,
    mean_curve,
    mean_std,
    method_label,
    pivot,
    plot_curves,
    register_table,
    rounds_to_reach,
    row_labeler,
    speedup,
    summary_value,
)

# The package re-exports the core API, nothing more. Written out so that type checkers see the
# re-exports; tests/secure_fl/test_report.py checks that it equals secure_fl.report.core.__all__.
__all__ = [
    "METHOD_LABELS",
    "METRICS",
    "TABLES",
    "MissingRunsError",
    "ReportError",
    "RunRecord",
    "TableContext",
    "TableReport",
    "TableSpec",
    "build_report",
    "format_mean_std",
    "format_percent",
    "get_table",
    "group_runs",
    "load_plugins",
    "load_runs",
    "markdown_table",
    "mean_curve",
    "mean_std",
    "method_label",
    "pivot",
    "plot_curves",
    "register_table",
    "rounds_to_reach",
    "row_labeler",
    "speedup",
    "summary_value",
]
