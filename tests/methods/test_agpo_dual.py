"""AGPO's controllers (recipe_apo/methods/agpo_dual/controllers.py): hand-worked cases, and cases transcribed
from the source.

Transcribed: the expected values of the TRANSCRIBED tables come from running the source's own functions
(wandugu/paper_agpo at 11e5596f5d51a56ec8ef6076948991cfd05c0ee8, src/llamafactory/train/agpo/trainer.py:
_bessel_std, _dispersion, _skewness, _extract_vote_key, _vote_entropy, compute_centered_uncertainty,
compute_adaptive_temperature, compute_adaptive_clip; the H_ref and KL_bar statements at T:559, 687, 706-710,
809-815) on the same inputs, with torch 2.13 on CPU, on 2026-12-05. CI cannot fetch the source, so the values are
held here; none of its code is in the project.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe_apo.methods.agpo_dual.controllers import (
    AgpoDualState,
    ProbeStats,
    dispersion,
    pooled_entropy,
    skewness,
    step_kl,
    vote_entropy,
)
from recipe_apo.methods.agpo_dual.settings import AgpoDualConfigError, AgpoDualSettings
from recipe_apo.methods.agpo_dual.vote_keys import (
    RULE,
    VoteKeyError,
    check_vote_key_name,
    load_vote_key,
    math_vote_key,
)
from recipe_apo.methods.errors import BatchInputError, MethodStateError

S = AgpoDualSettings()
A = [1, 0, 0, 0, 1, 1, 0, 0]
C = [0, 0, 0, 0, 0, 0, 0, 1]


def rows(*values):
    return np.array(values, dtype=np.float64)


# ---- transcribed from the source -------------------------------------------------------------------------------
TRANSCRIBED_STATS = [
    # rewards, std, mad, iqr, kappa
    (A, 0.5175491571426392, 0.0, 0.7412898540496826, 0.5271561741828918),
    ([1] * 8, 0.0, 0.0, 0.0, 0.0),
    (C, 0.3535533845424652, 0.0, 0.0, 2.3150322437286377),
    ([0, 0, 0, 0, 1, 1, 1, 1], 0.5345224738121033, 0.0, 0.7412898540496826, None),
]


@pytest.mark.parametrize("rewards, std, mad, iqr, kappa", TRANSCRIBED_STATS)
def test_the_probe_statistics_are_the_sources(rewards, std, mad, iqr, kappa):
    x = rows(rewards)
    assert dispersion(x, "std")[0] == std
    assert dispersion(x, "mad")[0] == mad
    assert dispersion(x, "iqr")[0] == iqr
    if kappa is not None:
        assert skewness(x)[0] == pytest.approx(kappa, rel=1e-6)


def test_skewness_of_one_outlier_is_the_sources_and_its_sign_follows_the_outlier():
    # kappa = mean(z^3) sqrt(n(n-1))/(n-2) with the Bessel std: for one outlier in n it is (n-1)^1.5 / n.
    assert skewness(rows([1, 1, 1, 1, 1, 1, 1, 0]))[0] == pytest.approx(-2.3150322437286377, rel=1e-6)
    assert skewness(rows([0] * 7 + [1e6]))[0] == pytest.approx(2.3150322437286377, rel=1e-6)
    assert skewness(rows(C))[0] == pytest.approx(7 ** 1.5 / 8, rel=1e-6)


def test_the_skewness_clamp_is_reached_only_past_102_samples():
    # transcribed: [0]*(n-1)+[1] gives 9.951346397399902 at n = 102 and the clamp 10.0 at n = 103
    assert skewness(rows([0] * 101 + [1]))[0] == pytest.approx(9.951346397399902, rel=1e-6)
    assert skewness(rows([0] * 102 + [1]))[0] == 10.0
    assert skewness(rows([1] * 102 + [0]))[0] == -10.0


TRANSCRIBED_KEYS = [
    ("so \\boxed{42}", "42"),
    ("the answer is \\boxed{\\frac{1}{2}} done", "2"),
    ("#### 17", "17"),
    ("x = 3 and then 5.5", "5.5"),
    ("no number here", "no number here"),
    ("\\boxed{a} and \\boxed{b}", "b"),
    ("\\boxed{ 7 }", "7"),
    ("#### 1,000", "1,000"),
    ("-3.", "-3"),
    ("", ""),
    ("   ", ""),
    ("#### ", ""),
    ("1e5", "5"),
    ("3/4 or 0/0", "0"),
    ("\\boxed{1,000}", "1,000"),
]


@pytest.mark.parametrize("text, key", TRANSCRIBED_KEYS)
def test_the_math_vote_key_is_the_sources(text, key):
    assert math_vote_key(text) == key


def test_vote_entropy_is_the_sources():
    mixed = [math_vote_key(t) for t in ["\\boxed{1}", "\\boxed{1}", "\\boxed{2}", "#### 2", "the answer is 3",
                                        "nothing", "nothing here either", "\\boxed{1}"]]
    assert mixed == ["1", "1", "2", "2", "3", "nothing", "nothing here either", "1"]
    h = vote_entropy([mixed, ["1"] * 8, [f"text {i}" for i in range(8)], []])
    assert h[0] == 1.4941751956939697
    # by hand: counts 3, 2, 1, 1, 1 of 8
    assert h[0] == pytest.approx(-(3 / 8 * math.log(3 / 8) + 2 / 8 * math.log(2 / 8) + 3 / 8 * math.log(1 / 8)),
                                 rel=1e-6)
    assert h[1] == 0.0 and h[2] == 2.0794413089752197 and h[3] == 0.0


TRANSCRIBED_TEMPERATURES = [
    # U, c, tau, U_bar after (a fresh state)
    (0.5, 0.0, 1.0, 0.5),
    (0.9, 0.7999999840000003, 1.1200000047683716, 0.54),
    (0.1, -0.8148147997256519, 0.8777777552604675, 0.49600000000000005),
    (0.5, 0.008064515966441105, 1.0012097358703613, 0.49640000000000006),
    (3.0, 5.043513194127454, 1.5, 0.7467600000000001),
    (0.0, -0.9999999866088168, 0.8500000238418579, 0.6720840000000001),
]


def test_a_run_of_temperature_calls_is_the_sources_call_by_call_and_as_one_batch():
    state = AgpoDualState()
    for u, c, tau, avg in TRANSCRIBED_TEMPERATURES:
        got_tau, got_c = state.temperatures(np.array([u]), S)
        assert (got_c[0], got_tau[0], state.uncertainty_avg) == (pytest.approx(c, rel=1e-12), tau, avg)
    batch = AgpoDualState()
    taus, cs = batch.temperatures(np.array([row[0] for row in TRANSCRIBED_TEMPERATURES]), S)
    assert taus.tolist() == [row[2] for row in TRANSCRIBED_TEMPERATURES]
    assert batch.uncertainty_avg == state.uncertainty_avg


def test_the_lower_temperature_clamp_and_the_restart_while_u_bar_is_zero():
    # transcribed, lambda 0.6 (not a default): U = 1 then 0 gives c = -0.99999999 and tau = 0.5
    steep = AgpoDualSettings(temperature_gain=0.6)
    tau, c = AgpoDualState().temperatures(np.array([1.0, 0.0]), steep)
    assert tau.tolist() == [1.0, 0.5] and c[1] == pytest.approx(-0.9999999900000002, rel=1e-12)
    # transcribed: U = 0, 0.5, 0: the start rule fires again while U_bar is 0
    state = AgpoDualState()
    tau, c = state.temperatures(np.array([0.0, 0.5, 0.0]), S)
    assert c.tolist()[:2] == [0.0, 0.0] and c[2] == pytest.approx(-0.9999999800000003, rel=1e-12)
    assert tau.tolist() == [1.0, 1.0, 0.8500000238418579] and state.uncertainty_avg == pytest.approx(0.45)


def stats(sigma=0.0, h_v=0.0, kappa=0.0):
    return ProbeStats(np.array([sigma]), np.array([h_v]), np.array([kappa]))


TRANSCRIBED_CLIPS = [
    # H_pi, H_ref before, sigma_p, H_v, KL_bar, kappa, eps, H_ref after
    (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.20000000298023224, 1.0),
    (2.0, 1.0, 0.5, 0.7, 0.1, 0.3, 0.20709677040576935, 1.01),
    (0.2, 1.0, 0.0, 0.0, 0.0, 0.0, 0.10000000149011612, 0.992),
    (5.0, 1.0, 0.0, 2.0, 0.0, 0.0, 0.36000001430511475, 1.04),
    (5.0, 1.0, 0.0, math.log(8), 0.0, 0.0, 0.36238324642181396, 1.04),
    (5.0, 1.0, 0.0, 5.0, 0.0, 0.0, 0.4000000059604645, 1.04),
    (1.0, 1.0, 3.0, 0.0, 2.0, 0.0, 0.05000000074505806, 1.0),
]


@pytest.mark.parametrize("h_pi, ref, sigma, h_v, kl, kappa, eps, ref_after", TRANSCRIBED_CLIPS)
def test_the_clip_is_the_sources(h_pi, ref, sigma, h_v, kl, kappa, eps, ref_after):
    state = AgpoDualState(entropy_ref=ref, kl_avg=kl)
    got, _ = state.clips(np.array([h_pi]), stats(sigma, h_v, kappa), S)
    assert got[0] == pytest.approx(eps, abs=1e-8)
    assert state.entropy_ref == pytest.approx(ref_after, rel=1e-12)


def test_the_clip_by_hand():
    # eps = 0.2 * clip(2 / (1 + 1e-8), 0.5, 1.5) * (1 + 0.1 * 0.7) / (1 + 0.5 + 0.5 * 0.1) = 0.2 * 1.5 * 1.07 / 1.55
    state = AgpoDualState(entropy_ref=1.0, kl_avg=0.1)
    eps, ratio = state.clips(np.array([2.0]), stats(0.5, 0.7, 0.3), S)
    assert eps[0] == pytest.approx(0.2 * 1.5 * 1.07 / 1.55, rel=1e-7) and ratio[0] == pytest.approx(2.0)
    # zeta weighs |kappa| in the denominator: 0.2 * 1 / (1 + 0.5 * 2) = 0.1
    eps, _ = AgpoDualState(entropy_ref=1.0).clips(np.array([1.0]), stats(kappa=-2.0),
                                                  AgpoDualSettings(clip_skewness=0.5))
    assert eps[0] == pytest.approx(0.1, rel=1e-7)


def test_a_batch_moves_h_ref_prompt_by_prompt_each_clip_reading_the_previous_prompts_h_ref():
    state = AgpoDualState()
    eps, ratio = state.clips(np.array([1.0, 2.0, 0.5]), ProbeStats(np.zeros(3), np.zeros(3), np.zeros(3)), S)
    # H_ref: starts at 1.0 (first H_pi), then 0.99 + 0.02 = 1.01, then 0.99 * 1.01 + 0.005
    assert ratio == pytest.approx([1.0, 2.0, 0.5 / 1.01], rel=1e-7)
    assert eps == pytest.approx([0.2, 0.2 * 1.5, 0.2 * 0.5], rel=1e-6)  # the ratio clamped to [0.5, 1.5]
    assert state.entropy_ref == pytest.approx(0.99 * 1.01 + 0.005, rel=1e-12)


def test_kl_bar_and_step_kl_are_the_sources():
    state = AgpoDualState()
    for value, expected in ((0.2, 0.020000000000000004), (0.0, 0.018000000000000006), (0.5, 0.06620000000000001)):
        state.add_step_kl(value, S)
        assert state.kl_avg == expected
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.3, 0.0]])
    new = torch.tensor([[-1.2, -1.9, -0.5], [-0.1, -0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # one prompt, tokens pooled: (0.2 - 0.1 + 0 - 0.2 - 0.1) / 5 = -0.04 -> 0
    assert step_kl(old, new, mask, np.array(["p", "p"])) == 0.0
    # two prompts: max(0.1 / 3, 0) and max(-0.3 / 2, 0), averaged
    assert step_kl(old, new, mask, np.array(["p", "q"])) == pytest.approx(0.016666671261191368, rel=1e-6)


def test_h_pi_pools_a_prompts_tokens_and_a_prompt_without_tokens_gets_zero():
    entropy = torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    h = pooled_entropy(entropy, mask, np.array(["a", "a", "b"]), ["b", "a", "c"])
    assert h.tolist() == [0.0, 2.0, 0.0]
    with pytest.raises(BatchInputError, match="prompt 'z' has no probe statistics"):
        pooled_entropy(entropy, mask, np.array(["a", "a", "z"]), ["a"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=40), st.floats(0.0, 20.0), st.floats(0.01, 1.0))
def test_tau_always_lies_in_its_bounds_and_u_bar_between_the_values_seen(us, start, gain):
    settings_ = AgpoDualSettings(temperature_gain=gain)
    state = AgpoDualState(uncertainty_avg=start)
    tau, _ = state.temperatures(np.array(us), settings_)
    assert ((tau >= 0.5 - 1e-7) & (tau <= 1.5 + 1e-7)).all()
    # each update is a convex combination of the old U_bar and the new U, or the new U itself
    assert min([start, *us]) - 1e-9 <= state.uncertainty_avg <= max([start, *us]) + 1e-9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=20), st.floats(0, 3), st.floats(0, 3), st.floats(0, 5))
def test_eps_always_lies_in_its_bounds(h_pi, sigma, h_v, kl):
    n = len(h_pi)
    eps, _ = AgpoDualState(kl_avg=kl).clips(np.array(h_pi), ProbeStats(np.full(n, sigma), np.full(n, h_v),
                                                                    np.zeros(n)), S)
    assert ((eps >= 0.05 - 1e-8) & (eps <= 0.4 + 1e-8)).all()


# ---- state and settings ----------------------------------------------------------------------------------------
def test_the_state_round_trips_bit_for_bit_and_refuses_anything_else():
    state = AgpoDualState(uncertainty_avg=0.1 + 0.2, entropy_ref=1 / 3, kl_avg=2.0 ** -60)
    restored = AgpoDualState()
    restored.load_state_dict(state.state_dict())
    assert restored.state_dict() == state.state_dict()
    for bad, part in (({"uncertainty_avg": 1.0}, "exactly"), ({**state.state_dict(), "kl_avg": -1.0}, "kl_avg"),
                      ({**state.state_dict(), "entropy_ref": "1"}, "entropy_ref"), ([], "exactly")):
        keep = AgpoDualState(uncertainty_avg=5.0)
        with pytest.raises(MethodStateError, match=part):
            keep.load_state_dict(bad)
        assert keep.uncertainty_avg == 5.0  # nothing half-restored


@pytest.mark.parametrize("key, value, message", [
    ("probe_samples", 0, "algorithm.agpo_dual.probe_samples"),
    ("probe_samples", 2.5, "algorithm.agpo_dual.probe_samples"),
    ("base_temperature", 0.0, "algorithm.agpo_dual.base_temperature"),
    ("min_temperature", 2.0, "min_temperature=2.0 is above max_temperature=1.5"),
    ("average_rate", 0.0, "algorithm.agpo_dual.average_rate"),
    ("clip_max", 1.0, "algorithm.agpo_dual.clip_max"),
    ("clip_min", 0.45, "clip_min=0.45 is above clip_max=0.4"),
    ("clip_base", 0.5, r"clip_base=0.5 is outside \[clip_min, clip_max\] = \[0.05, 0.4\]: every calm prompt's clip"),
    ("clip_base", 0.01, r"clip_base=0.01 is outside \[clip_min, clip_max\] = \[0.05, 0.4\]"),
    ("dispersion", "var", "algorithm.agpo_dual.dispersion"),
    ("weight_dispersion", -1.0, "algorithm.agpo_dual.weight_dispersion"),
    ("clip_kl", True, "algorithm.agpo_dual.clip_kl"),
    ("vote_key", "no_colon", "algorithm.agpo_dual.vote_key"),
    ("entropy_ratio_min", float("nan"), "algorithm.agpo_dual.entropy_ratio_min"),
])
def test_a_bad_setting_is_refused_in_one_line_naming_it(key, value, message):
    with pytest.raises(AgpoDualConfigError, match=message) as info:
        AgpoDualSettings.from_algorithm_config({"agpo_dual": {key: value}})
    assert "\n" not in str(info.value)


def test_an_unknown_setting_is_refused_naming_it():
    with pytest.raises(AgpoDualConfigError, match="unknown setting algorithm.agpo_dual.probe_sample;"):
        AgpoDualSettings.from_algorithm_config({"agpo_dual": {"probe_sample": 8}})


def test_non_finite_probe_rewards_are_refused_naming_the_prompt():
    with pytest.raises(BatchInputError, match="prompt 1 has a non-finite reward"):
        ProbeStats.of(np.array([[0.0, 1.0], [np.nan, 1.0]]), [["a", "b"], ["a", "b"]])


def test_clip_base_at_either_bound_is_accepted():
    assert AgpoDualSettings(clip_base=0.4).clip_base == 0.4
    assert AgpoDualSettings(clip_base=0.05, clip_min=0.05).clip_base == 0.05


# ---- vote keys that name process or file-system functions (issue 51, 6b) ----------------------------------------
@pytest.mark.parametrize("spec, reason", [
    ("os:mkdir", "os reaches processes, files, the network or the interpreter"),
    ("os.path:exists", "os reaches"),
    ("posixpath:basename", "posixpath reaches"),
    ("posix:system", "posix reaches"),
    ("subprocess:getoutput", "subprocess reaches"),
    ("shutil:rmtree", "shutil reaches"),
    ("pathlib:Path", "pathlib reaches"),
    ("sys:exit", "sys reaches"),
    ("importlib:import_module", "importlib reaches"),
    ("socket:gethostbyname", "socket reaches"),
    ("io:open", "io reaches"),
    ("webbrowser:open", "webbrowser reaches"),
    (" tempfile :mkdtemp", "tempfile reaches"),
    ("torch:load", "torch reaches"),
    ("numpy:loadtxt", "numpy reaches"),
    ("builtins:open", "builtins' open opens files, runs or imports code, reads the terminal or exits"),
    ("builtins:eval", "builtins' eval opens"),
    ("builtins:exec", "builtins' exec opens"),
    ("builtins:__import__", "builtins' __import__ opens"),
    ("builtins:input", "builtins' input opens"),
    ("recipe_apo.integration.jsonl:append", "recipe_apo.integration.jsonl's append is the recipe's own"),
    ("recipe_apo.methods.agpo_dual.vote_keys:load_vote_key",
     "recipe_apo.methods.agpo_dual.vote_keys's load_vote_key is the recipe's own (of its functions only math_vote_key"),
])
def test_a_vote_key_naming_a_process_or_file_function_is_refused_before_it_is_imported_or_called(spec, reason):
    for check in (check_vote_key_name, load_vote_key):
        with pytest.raises(VoteKeyError) as refused:
            check(spec)
        message = str(refused.value)
        assert message.startswith(f"algorithm.agpo_dual.vote_key={spec!r} is refused: {reason}")
        assert message.endswith(f"; {RULE}") and "\n" not in message


@pytest.mark.parametrize("source, defined", [
    ("from os import system as key\n", "posix's system"),
    ("import subprocess\nkey = subprocess.getoutput\n", "subprocess's getoutput"),
    ("import functools, shutil\nkey = functools.partial(shutil.rmtree, ignore_errors=True)\n", "shutil's rmtree"),
    ("key = eval\n", "builtins' eval"),
])
def test_a_function_of_ones_own_module_that_is_a_refused_one_is_refused_by_where_it_is_defined(
        tmp_path, monkeypatch, source, defined):
    name = f"vote_key_alias_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(VoteKeyError) as refused:
        load_vote_key(f"{name}:key")
    message = str(refused.value)
    owner, function = defined.split("'s ") if "'s " in defined else defined.split("' ")
    assert message.startswith(f"algorithm.agpo_dual.vote_key='{name}:key' is refused: it is {owner}'s {function}, and")
    assert message.endswith(RULE) and "\n" not in message


def test_the_dry_run_check_finds_a_users_module_without_running_it(tmp_path, monkeypatch):
    """A module that would make a folder when imported, and a function that would make one when called: the dry
    run's check finds the module and runs neither; the launch's load imports and calls it once."""
    (tmp_path / "vote_key_side_effects.py").write_text(
        "import os\nos.makedirs(os.path.join(os.path.dirname(__file__), 'imported'), exist_ok=True)\n"
        "def key(text):\n    os.makedirs(os.path.join(os.path.dirname(__file__), 'called'), exist_ok=True)\n"
        "    return text[-3:]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_vote_key_name("vote_key_side_effects:key")
    assert not (tmp_path / "imported").exists() and not (tmp_path / "called").exists()
    with pytest.raises(VoteKeyError, match=r"^algorithm.agpo_dual.vote_key='no_such_vote_key_module:f' cannot be "
                                           r"loaded \(no module named 'no_such_vote_key_module'\)$"):
        check_vote_key_name("no_such_vote_key_module:f")
    assert load_vote_key("vote_key_side_effects:key")("abc}.") == "c}."
    assert (tmp_path / "imported").exists() and (tmp_path / "called").exists()


@pytest.mark.parametrize("spec", ["builtins:str", "string:capwords", "re:escape", "html:escape",
                                  "recipe_apo.methods.agpo_dual.vote_keys:math_vote_key"])
def test_text_functions_of_the_standard_library_are_not_refused_by_name(spec):
    check_vote_key_name(spec)
    assert isinstance(load_vote_key(spec)("The answer is 12."), str)


def test_a_vote_key_that_exits_is_one_line_not_an_exit(tmp_path, monkeypatch):
    (tmp_path / "vote_key_exits.py").write_text("import sys\ndef key(text):\n    sys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(VoteKeyError, match=r"^algorithm.agpo_dual.vote_key='vote_key_exits:key' fails on a sample "
                                           r"response \(SystemExit: 3\)"):
        load_vote_key("vote_key_exits:key")
