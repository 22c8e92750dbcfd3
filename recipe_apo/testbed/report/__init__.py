"""The testbed's reports, apart from the adapter that trains (``train``, ``update``, ``rollout``, ``policy``) and the
tasks: they read what a run recorded (each round's history) and write what a reader sees.

- ``stats``: the paired statistics (a difference beyond seed noise or within it);
- ``summary``: a run's ``summary.json`` from its rounds, and its files (``write_outputs``);
- ``markdown``: its ``report.md``; ``plots``: its plots and the league's;
- ``league``: a league's ``league.json`` / ``league.md`` / ``league.png`` from its scenarios' summaries;
- ``collect``: a sweep's jobs in one table.

Every row, column and plot of a method's own comes from the metrics it declares (``recipe_apo.methods.base.Metric``:
its words and roles); nothing here names a method (``tests/test_layers.py`` checks it).
"""
