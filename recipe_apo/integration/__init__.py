"""verl integration: what connects the methods' maths (``recipe_apo.methods``) to verl's PPO pipeline.

- ``trainer``: verl's synchronous V1 trainer running the recipe's hooks at verl's hand-off points;
  ``hooks``: one module per feature (the APO anchor, CoDaPO's hand-off and resampling, the zero-variance
  rescale, the audit's dump fields); ``batch_fields``: reading and writing a batch's fields in TransferQueue;
- ``task_runner``: verl's Ray task runner with the recipe's trainer and the start-up node check (``cluster``,
  ``node_probe``);
- ``checkpoint``: the anchor in verl's checkpoint folders; ``resampling``: CoDaPO's kept prompts across steps;
- ``presets``: the method presets (``conf/method/*.yaml``), the one list of methods;
- ``validation``, ``naming``, ``errors``: the config checks before Ray starts, run names, the config errors;
- ``jsonl``: the one JSONL reader (audit dumps, evaluation scores).
"""
