"""Optimizers as plug-ins: one file each, `Config` a subclass of `models.OptimizerConfig`
(see models/__init__.py). Selected by `train.optimizer.name`.

  adamw      AdamW, torch's fused kernel where it has one (the default)
  muon       Muon on the hidden matrices, AdamW on everything else; sharded matrices
             orthogonalised whole, by one owner rank each
  adafactor  torch.optim.Adafactor: factored second moments for matrices
  sgd        SGD with (Nesterov) momentum: one buffer per parameter
  _groups    parameter grouping shared by the plug-ins (a helper, not a plug-in)
"""
