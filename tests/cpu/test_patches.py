"""The rehearsal's rendezvous ports (recipe_apo.cpu.patches): in 28000-32767, between the vLLM engines' base ports
and the kernel's ephemeral range, and set on every verl worker group that does not name its own."""

from __future__ import annotations

import random
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe_apo.cpu import patches
from recipe_apo.cpu.platform import RENDEZVOUS_PORTS, VLLM_PORT_SLOTS


@given(seed=st.integers(0, 2**32 - 1), ephemeral_low=st.integers(1024, 65535))
def test_the_range_lies_above_the_engines_ports_and_below_the_ephemeral_range(seed, ephemeral_low):
    ports = patches.rendezvous_port_range(ephemeral_low, random.Random(seed))
    if ephemeral_low < 28000 + 200 + 1:
        assert ports is None
        return
    first, last = ports
    assert last - first == 200
    assert 28000 <= first and last <= min(32768, ephemeral_low)


def test_the_rendezvous_ports_and_the_vllm_engines_slots_do_not_overlap():
    start, stop, step = VLLM_PORT_SLOTS
    engines = {port for base in range(start, stop, step) for port in range(base, base + step)}
    assert RENDEZVOUS_PORTS == (28000, 32768) and not engines & set(range(*RENDEZVOUS_PORTS))


def test_two_draws_differ_so_two_runs_start_apart():
    rng = random.Random(7)
    assert patches.rendezvous_port_range(32768, rng) != patches.rendezvous_port_range(32768, rng)


class _Group:
    def __init__(self, resource_pool=None, master_port_range=None, **kwargs):
        self.master_port_range = master_port_range


@pytest.fixture
def base():
    module = types.SimpleNamespace(RayWorkerGroup=type("RayWorkerGroup", (_Group,), {}))
    patches._rendezvous_ports(module)
    patches._rendezvous_ports(module)  # idempotent: one wrapper
    return module


def test_a_group_without_a_range_gets_one_below_the_ephemeral_range(base, monkeypatch):
    monkeypatch.setattr(patches, "_ephemeral_low", lambda: 32768)
    first, last = base.RayWorkerGroup(resource_pool=None).master_port_range
    assert 28000 <= first < last <= 32768


def test_a_group_that_names_its_range_keeps_it(base):
    assert base.RayWorkerGroup(master_port_range=[40000, 40010]).master_port_range == [40000, 40010]


def test_the_patch_is_applied_once(base):
    assert base.RayWorkerGroup.__init__.__wrapped__ is _Group.__init__
