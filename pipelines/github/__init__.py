"""The code host: PyGithub adapter, sticky comment, webhook events, ChatOps, promotion, runners.

Import the submodules directly (`from pipelines.github.comment import StickyComment`);
this package imports nothing heavy so `pipeline --help` stays fast.
"""
