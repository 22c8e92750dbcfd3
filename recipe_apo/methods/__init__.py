"""The methods' maths, one module each, needing only torch, numpy, pandas and verl's ``core_algos``: no Ray,
no Hydra, no trainer; of the recipe, only ``recipe_apo.errors`` (which imports nothing). The verl integration
(``recipe_apo.plugin``, ``recipe_apo.integration``) sits on it.

- ``apo``: the APO advantage estimator (A_i, Phi_i, Delta_g); ``anchor``: the capability anchor C_t, eta_t;
  ``apo_settings``: ``algorithm.apo``; ``success``: s(R); ``apo_loss``: the soft-gated loss with 1/L0.
- ``codapo``: CoDaPO's confidence-difficulty weight and its prompt-resampling rule.
- ``zero_variance``: AGPO's zero-variance denominator for any group estimator.
- Shared by the methods: ``groups`` (group ids from uids, group means, R_i), ``settings`` (reading a method's
  ``algorithm.<method>`` node), ``errors`` (``BatchInputError`` for a batch an estimator cannot use,
  ``MethodConfigError`` for a refused setting; both subclass ``recipe_apo.errors.RecipeError``), ``tensors``
  (the estimators' new outputs, and vectors of batch size to and from numpy).
"""
