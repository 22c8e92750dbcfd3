"""Every test in this folder runs verl's whole loop or a real FSDP2 step (Ray sessions, subprocesses): marked
``e2e`` so that ``pytest -m "not e2e"`` runs the rest of the suite in minutes."""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def tiny(tiny_task):
    return tiny_task
