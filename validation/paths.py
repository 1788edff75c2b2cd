"""Moved to `basics.paths` (issue 39, item 6). A temporary alias while trainer/ is rewritten beside
this change; it goes in the same session, once trainer/ imports `basics.paths`."""

import sys

from basics import paths as _moved
from basics.paths import *  # noqa: F403 - the names, for the type checker

sys.modules[__name__] = _moved
