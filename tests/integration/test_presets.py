"""The method presets (``recipe_apo.integration.presets``): the one list of methods, read from conf/method/*.yaml,
in their declared order; and a preset file added there appearing in every tool that lists methods."""

import os
import shutil
import subprocess

import pytest
from helpers.paths import ROOT
from omegaconf import OmegaConf

from recipe_apo.integration import presets
from recipe_apo.methods import catalog

METHOD_DIR = ROOT / "conf" / "method"

# A preset that is not the recipe's, declared between Dr. GRPO and APO: verl's rloo estimator needs nothing but
# the batch, so the demo and the audit can run it too.
EXTRA = "rloo"
EXTRA_TEXT = """# @package _global_
# preset: {order: 2.5, title: RLOO}
algorithm:
  adv_estimator: rloo
  norm_adv_by_std_in_grpo: false
  use_kl_in_reward: false
actor_rollout_ref:
  actor:
    policy_loss:
      loss_mode: vanilla
    loss_agg_mode: seq-mean-token-sum-norm
    loss_scale_factor: ${data.max_response_length}
    use_kl_loss: false
"""


def test_the_presets_in_their_declared_order_with_their_titles():
    # The list itself is pinned once, with the catalog: tests/test_catalog.py.
    assert set(presets.names()) == {path.stem for path in METHOD_DIR.glob("*.yaml")}  # every file, none other
    orders = [p.order for p in presets.presets()]
    assert None not in orders and orders == sorted(orders)
    assert presets.preset("drgrpo").title == "Dr. GRPO"  # its header's
    for method in catalog.methods():  # a method's preset whose header names no title: the method's
        assert all(presets.preset(name).title == method.title for name in method.presets)
    with pytest.raises(KeyError, match="presets: " + ", ".join(presets.names())):
        presets.preset("ppo")


def test_each_declaration_follows_hydras_header_and_is_only_a_comment():
    for path in sorted(METHOD_DIR.glob("*.yaml")):
        lines = path.read_text().splitlines()
        assert lines[0] == "# @package _global_", path.name  # Hydra's header, still its first line
        assert lines[1].startswith("# preset: "), path.name
        # YAML (what Hydra and verl read) sees a comment: the same keys as without the line.
        assert OmegaConf.load(path) == OmegaConf.create("\n".join(lines[:1] + lines[2:]))


def test_settings_are_the_composed_presets():
    assert presets.settings("grpo") == presets.MethodSettings("grpo", True, "vanilla", "seq-mean-token-mean")
    assert presets.settings("drgrpo") == presets.MethodSettings("grpo", False, "vanilla", "seq-mean-token-sum-norm")
    assert presets.settings("apo") == presets.MethodSettings("apo", False, "apo", "seq-mean-token-sum-norm")
    assert presets.settings("codapo") == presets.MethodSettings("codapo", True, "vanilla", "token-mean",
                                                                needs="the old policy's log-probs")
    assert presets.settings("agpo_dual") == presets.MethodSettings("grpo", True, "agpo_clip", "seq-mean-token-mean")
    # AGPO's dual feedback gives GRPO's advantages (its runtime changes none): the demo and the audit show one.
    assert presets.settings("agpo_dual").advantages == presets.settings("grpo").advantages
    assert presets.settings("agpo") == presets.MethodSettings("agpo", True, "agpo", "token-mean")
    assert presets.settings("apo").advantages != presets.settings("drgrpo").advantages


def test_the_declaration_line():
    parse = presets.parse_declaration
    assert parse("# @package _global_\n# preset: {order: 2, title: Dr. GRPO}\na: 1\n") == {"order": 2,
                                                                                            "title": "Dr. GRPO"}
    assert parse("# @package _global_\n# A preset.\n# preset: {order: 1.5}\na: 1\n") == {"order": 1.5}
    assert parse("# @package _global_\n# A preset without one.\na: 1\n# preset: {order: 1}\n") == {}
    bad = {
        "# preset: {order: 1}\n# @package _global_\na: 1\n": "'# @package' must be the first line",
        "# @package _global_\n# preset: {order: one}\n": "order must be a number",
        "# @package _global_\n# preset: {order: 1, name: x}\n": "must be a mapping of order, title",
        "# @package _global_\n# preset: [1, 2]\n": "must be a mapping of order, title",
        "# @package _global_\n# preset: {order: 1\n": "is not a YAML mapping",
        "# @package _global_\n# preset: {title: ''}\n": "title must be a non-empty string",
    }
    for text, message in bad.items():
        with pytest.raises(presets.PresetError, match=message):
            parse(text, "conf/method/x.yaml")


def test_undeclared_presets_come_last_by_name(tmp_path, monkeypatch):
    declared = presets.names()
    for path in METHOD_DIR.glob("*.yaml"):
        shutil.copy(path, tmp_path)
    (tmp_path / "zeta.yaml").write_text("# @package _global_\nalgorithm: {adv_estimator: grpo}\n")
    (tmp_path / "beta.yaml").write_text("# @package _global_\nalgorithm: {adv_estimator: grpo}\n")
    (tmp_path / "notes.txt").write_text("not a preset")
    monkeypatch.setattr(presets, "_directory", lambda: tmp_path)
    assert presets.names() == (*declared, "beta", "zeta")
    assert presets.preset("zeta").title == "zeta"


def test_compose_leaves_another_hydra_context_as_it_was(tmp_path):
    from hydra import compose, initialize_config_dir

    (tmp_path / "other.yaml").write_text("answer: 42\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        config = presets.compose("drgrpo")  # the recipe's config is not on this search path
        assert config.algorithm.adv_estimator == "grpo" and config.algorithm.norm_adv_by_std_in_grpo is False
        assert compose("other").answer == 42


@pytest.fixture
def extra_preset(tmp_path, monkeypatch):
    """conf/method/ plus ``rloo.yaml``, for presets.py (a copy of the folder) and for Hydra (the same preset in
    its ConfigStore, as ``method=rloo``); the testbed's preset defaults stored again for it, then restored."""
    from hydra.core.config_store import ConfigStore

    from recipe_apo.integration import replay
    from recipe_apo.testbed import configs

    folder = tmp_path / "conf" / "method"
    folder.mkdir(parents=True)
    for path in METHOD_DIR.glob("*.yaml"):
        shutil.copy(path, folder)
    (folder / f"{EXTRA}.yaml").write_text(EXTRA_TEXT)
    monkeypatch.setattr(presets, "_directory", lambda: folder)
    store = ConfigStore.instance()
    store.store(group="method", name=EXTRA, node=OmegaConf.create(EXTRA_TEXT), package="_global_")
    configs.store_settings()
    monkeypatch.setattr(replay, "_METHODS", None)
    try:
        yield tmp_path
    finally:
        store.repo["method"].pop(f"{EXTRA}.yaml", None)
        monkeypatch.undo()
        configs.store_settings()
        presets.settings.cache_clear()


def test_an_extra_preset_appears_everywhere(extra_preset, capsys, monkeypatch):
    from hydra import compose, initialize_config_module

    from recipe_apo.__main__ import main as demo
    from recipe_apo.cpu import rehearse
    from recipe_apo.integration import replay
    from recipe_apo.testbed.configs import method_configs

    order = presets.names()  # its order 2.5 puts it between Dr. GRPO's 2 and APO's 3
    assert order[order.index("drgrpo") + 1:order.index("apo")] == (EXTRA,)
    assert presets.settings(EXTRA) == presets.MethodSettings("rloo", False, "vanilla", "seq-mean-token-sum-norm")

    # The rehearsal: its default and its --methods choices.
    runs = []
    monkeypatch.setattr(rehearse, "rehearse", lambda out, steps, methods, **kwargs: runs.append(list(methods)) or 0)
    assert rehearse.main([]) == 0 and rehearse.main(["--methods", f"{EXTRA},apo"]) == 0
    assert runs == [list(order), [EXTRA, "apo"]]

    # The audit replays it, in its place, by its title.
    assert [m.name for m in replay.preset_methods()] == ["GRPO", "Dr. GRPO", "RLOO", "APO", "AGPO"]
    assert replay.method_named("RLOO").adv_estimator == "rloo"

    # The testbed runs it by default, in the league too.
    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        cfg = compose(config_name="testbed")
        assert list(cfg.methods) == list(order) and list(cfg.league.methods) == list(order)
        assert list(cfg.methods[EXTRA]) == [f"method={EXTRA}"]
        assert method_configs(["seeds=[0]"])[EXTRA].algorithm.adv_estimator == "rloo"

    # The demo shows its column between Dr. GRPO's and APO's, the three others' numbers unchanged.
    demo()
    out = capsys.readouterr().out
    header = next(line.split() for line in out.splitlines() if line.startswith("prompt"))
    assert header[-6:] == ["GRPO", "Dr.", "GRPO", "RLOO", "APO", "AGPO"]
    rows = [line.split() for line in out.splitlines() if line.startswith(("hard prompt", "easy prompt"))]
    # RLOO: 1 - mean of the other three (0) = 1; 0 - 1/3. AGPO's dual feedback has GRPO's advantages: no column.
    assert rows[0][-5:] == ["1.500", "0.750", "1.000", "1.445", "1.500"]
    assert rows[1][-5:] == ["-0.500", "-0.250", "-0.333", "-0.292", "-0.500"]
    assert "codapo    not on this batch: its estimator also needs the old policy's log-probs" in out

    # The launch scripts' check, which lists the preset files from bash.
    lib = extra_preset / "scripts" / "lib"
    lib.mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "lib" / "recipe_launch.sh", lib)

    def parse(*args):
        script = f'source "{lib / "recipe_launch.sh"}"; recipe_parse_method "$@"; echo "$METHOD"'
        env = {k: v for k, v in os.environ.items() if k != "METHOD"}
        return subprocess.run(["bash", "-c", script, "bash", *args], capture_output=True, text=True, env=env)

    assert parse(f"method={EXTRA}").stdout == f"{EXTRA}\n"
    refused = parse("method=ppo")
    assert refused.returncode == 2
    assert "(agpo, agpo_dual, apo, codapo, drgrpo, grpo, r2po, rloo), got 'ppo'" in refused.stderr
