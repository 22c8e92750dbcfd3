"""The methods' maths, one module each, needing only torch, numpy, pandas and verl's ``core_algos``: no Ray,
no Hydra, no trainer. The verl integration (``recipe_apo.plugin``, ``recipe_apo.trainer``, ...) sits on it.

- ``apo``: the APO advantage estimator (A_i, Phi_i, Delta_g); ``anchor``: the capability anchor C_t, eta_t;
  ``apo_settings``: ``algorithm.apo``; ``success``: s(R); ``apo_loss``: the soft-gated loss with 1/L0.
- ``codapo``: CoDaPO's confidence-difficulty weight and its prompt-resampling rule.
- ``zero_variance``: AGPO's zero-variance denominator for any group estimator.
"""
