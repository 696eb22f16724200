"""Reports: finished runs from the run store → paper-shaped Markdown tables and plots.

:mod:`secure_fl.report.core` holds the API (loading runs, :class:`RunRecord`, the table
registry :data:`TABLES` with :func:`register_table`, Markdown/statistics/plot helpers);
every other module of this package is a formatter plug-in for one paper's tables
(``fedshift``, ``climb``, ``ratio_loss``, ...), imported on first use by :func:`get_table`
or all at once by :func:`load_plugins`. ``secure-fl report`` is the command-line face.
"""

# `import *` follows core.__all__ and is what type checkers treat as a re-export, so the names
# are listed once, in core.
from secure_fl.report.core import *
from secure_fl.report.core import __all__ as __all__
