"""The methods, one package each (its maths, loss, settings, launch checks and runtime), listed in ``catalog``; and
what they share: ``base`` (what a method declares, what its runtime gets and gives), ``state_codec`` (a runtime's
checkpoint file), ``driver_state`` (what passes through verl's driver process beside an estimator's arguments),
``handoff`` (the adapters' side of it: a runtime never touches the driver's state), ``loss_inputs`` (per-row inputs
a loss reads), and the checks, groups, statistics and errors every method uses.

Needs torch, numpy, pandas, OmegaConf nodes and verl's ``core_algos`` only: no Ray, no Hydra, no trainer; of the
recipe, only ``recipe_apo.errors``. The verl integration (``recipe_apo.integration``) and the tools sit on it.
"""
