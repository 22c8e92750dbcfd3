"""verl integration: verl's trainer as one of the two adapters of the methods' runtimes (``trainer``, every verl
internal it touches in ``verl_access``), the launch (``validation``: generic checks, then every method's own), the
methods' state in verl's checkpoints, and the plumbing around them. Module by module: docs/internals.md."""
