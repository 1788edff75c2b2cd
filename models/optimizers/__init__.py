"""Optimizers as plug-ins: one file each, `Config` a subclass of `models.OptimizerConfig`
(see models/__init__.py). Selected by `train.optimizer.name`."""
