"""Moved to `basics.environment` (issue 39, item 6). A temporary alias while trainer/ is rewritten beside
this change; it goes in the same session, once trainer/ imports `basics.environment`."""

import sys

from basics import environment as _moved
from basics.environment import *  # noqa: F403 - the names, for the type checker

sys.modules[__name__] = _moved
