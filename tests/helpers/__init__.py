"""Helpers the tests share: the repository's paths (``paths``), config composition (``composing``), running the
training entry in the test's own process (``in_process``), the rehearsal's run folders (``rehearsal_runs``) and the
testbed's smallest config (``testbed_tiny``)."""
