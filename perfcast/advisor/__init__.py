"""The advisor: runs every applicable what-if and ranks them by predicted gain.

It sits above `whatif/` (it drives the models) and below `report/`, the CLI and the API,
which are the only packages that import it.
"""

from perfcast.advisor.advisor import Advice, NotApplicable, Suggestion, advise

__all__ = ["Advice", "NotApplicable", "Suggestion", "advise"]
