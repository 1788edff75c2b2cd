"""Deprecated: the planner moved to the `validation.plan` package; this module re-exports it."""

from validation.plan import *  # noqa: F403
from validation.plan import __all__ as __all__
from validation.plan.layout import _candidates  # noqa: F401
