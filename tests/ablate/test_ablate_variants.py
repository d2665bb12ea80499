"""The ablation plan: ladder rungs in the paper's order, grids, filters, seeds, names and ids (pure, no training)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from dapo_cli.ablate.variants import (
    LADDER_LABELS,
    PAPER_AIME24_AVG32,
    ablation_id,
    child_label,
    child_run_name,
    make_ablation,
    parse_techniques,
    safe_component,
    short_variant,
)
from dapo_cli.ablate.axes import parse_axes
from dapo_cli.ablate.child import train_words
from dapo_cli.cli.options import resolve
from dapo_cli.config import TECHNIQUES, load_config, technique_state
from dapo_cli.config.techniques import Techniques
from dapo_cli.config.load import build_config, override_config
from dapo_cli.errors import UserError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg():
    return load_config()  # the embedded tiny experiment (every technique on)


def test_ladder_is_table_1_in_order_with_cumulative_toggles(cfg) -> None:
    plan = make_ablation(cfg, mode="ladder")
    assert [v.label for v in plan.variants] == [
        "Naive GRPO", "+ Overlong Filtering", "+ Clip-Higher", "+ Soft Overlong Punishment", "+ Token-level Loss",
        "+ Dynamic Sampling (DAPO)",
    ]
    assert [v.paper for v in plan.variants] == [30, 36, 38, 41, 42, 50]
    assert [v.name for v in plan.variants] == [
        "grpo",
        "grpo+overlong_filtering",
        "grpo+overlong_filtering+clip_higher",
        "grpo+overlong_filtering+clip_higher+overlong_shaping",
        "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss",
        "dapo",
    ]
    for rung, child in enumerate(plan.children):
        child_cfg = plan.child_config(child)
        # rung r has exactly the first r techniques on, measured on the config it will train
        assert technique_state(child_cfg) == {t: j < rung for j, t in enumerate(TECHNIQUES)}
        assert child.index == rung
    naive = plan.child_config(plan.children[0]).algorithm
    # naive GRPO: symmetric clip 0.2, seq-mean-token-mean, no shaping, no filtering, no dynamic sampling
    assert (naive.clip_ratio_low, naive.clip_ratio_high) == (0.2, 0.2)
    assert naive.loss_agg_mode == "seq-mean-token-mean"
    assert not naive.overlong_buffer.enable and not naive.overlong_filter and not naive.filter_groups.enable
    assert plan.child_config(plan.children[2]).algorithm.clip_ratio_high == 0.28


def test_paper_constants_line_up() -> None:
    assert len(LADDER_LABELS) == len(PAPER_AIME24_AVG32) == len(TECHNIQUES) + 1


def test_full_grid_has_32_distinct_variants_fewest_first(cfg) -> None:
    plan = make_ablation(cfg, mode="grid")
    assert len(plan.variants) == 32
    assert len({v.name for v in plan.variants}) == 32
    assert plan.variants[0].name == "grpo" and plan.variants[-1].name == "dapo"
    counts = [sum(on for _, on in v.state) for v in plan.variants]
    assert counts == sorted(counts)
    # the six ladder states are among them and carry the paper's number
    assert sorted(v.paper for v in plan.variants if v.paper is not None) == [30, 36, 38, 41, 42, 50]
    # with one technique on, they come in ladder order
    assert [v.name for v in plan.variants[1:6]] == [f"grpo+{t}" for t in TECHNIQUES]


def test_grid_subset_leaves_other_techniques_as_configured(cfg) -> None:
    off = build_config(None, ["algorithm.overlong_filter=false"])
    plan = make_ablation(off, mode="grid", techniques=parse_techniques("dynamic_sampling,clip_higher"))
    assert plan.techniques == ("clip_higher", "dynamic_sampling")  # paper order whatever the typed order
    names = [v.name for v in plan.variants]
    assert names == [
        "grpo+overlong_shaping+token_level_loss",
        "grpo+clip_higher+overlong_shaping+token_level_loss",
        "grpo+overlong_shaping+token_level_loss+dynamic_sampling",
        "grpo+clip_higher+overlong_shaping+token_level_loss+dynamic_sampling",
    ]
    for child in plan.children:
        assert plan.child_config(child).algorithm.overlong_filter is False  # untouched by the grid
    assert [dict(v.toggles) for v in plan.variants][1] == {"clip_higher": True, "dynamic_sampling": False}


def test_parse_techniques_accepts_dashes_and_all_and_rejects_unknown() -> None:
    assert parse_techniques(None) == TECHNIQUES
    assert parse_techniques("all") == TECHNIQUES
    assert parse_techniques("clip-higher") == ("clip_higher",)
    with pytest.raises(UserError, match="unknown technique.*clip_hi.*valid: overlong_filtering"):
        parse_techniques("clip_hi")
    with pytest.raises(UserError, match="use --grid for a subset"):
        make_ablation(load_config(), mode="ladder", techniques=("clip_higher",))


def test_only_and_skip_filter_by_name_and_unknown_names_list_the_valid_ones(cfg) -> None:
    plan = make_ablation(cfg, mode="ladder", only=["dapo", "grpo"])
    assert [v.name for v in plan.variants] == ["grpo", "dapo"]  # plan order, not the order typed
    plan = make_ablation(cfg, mode="ladder", skip=["dapo"])
    assert len(plan.variants) == 5 and plan.variants[-1].paper == 42
    with pytest.raises(UserError, match="unknown variant.*grp0.*this plan has: grpo, grpo\\+overlong_filtering"):
        make_ablation(cfg, mode="ladder", only=["grp0"])
    with pytest.raises(UserError, match="left no variant"):
        make_ablation(cfg, mode="ladder", only=["grpo"], skip=["grpo"])
    with pytest.raises(UserError, match="unknown ablation mode 'steps'; valid: ladder, grid"):
        make_ablation(cfg, mode="steps")


def test_seeds_count_up_from_trainer_seed_seed_major(cfg) -> None:
    base = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, seed=7))
    plan = make_ablation(base, mode="ladder", only=["grpo", "dapo"], seeds=3)
    assert plan.seeds == (7, 8, 9)
    assert [(c.variant.name, c.seed) for c in plan.children] == [
        ("grpo", 7), ("dapo", 7), ("grpo", 8), ("dapo", 8), ("grpo", 9), ("dapo", 9),
    ]
    assert plan.child_config(plan.children[3]).trainer.seed == 8
    with pytest.raises(UserError, match="--seeds must be >= 1"):
        make_ablation(cfg, mode="ladder", seeds=0)


def test_ablation_id_is_stable_and_changes_with_config_mode_and_variants_not_seeds(cfg) -> None:
    a = make_ablation(cfg, mode="ladder")
    assert make_ablation(load_config(), mode="ladder").ablation_id == a.ablation_id  # a fresh load: same id
    steps = build_config(None, ["trainer.total_steps=5"])
    others = [
        make_ablation(steps, mode="ladder"),
        make_ablation(cfg, mode="grid"),
        make_ablation(cfg, mode="ladder", skip=["dapo"]),
        make_ablation(build_config(None, ["trainer.seed=7"]), mode="ladder"),  # another base seed: other children
    ]
    assert len({a.ablation_id, *(p.ablation_id for p in others)}) == 5
    # more seeds of the same ladder: the same parent (its finished seeds are skipped, the new ones trained)
    assert make_ablation(cfg, mode="ladder", seeds=3).ablation_id == a.ablation_id
    # the launcher is not part of the experiment: print and local find the same parent
    printed = dataclasses.replace(cfg, ablate=dataclasses.replace(cfg.ablate, launcher="print"))
    assert ablation_id(printed, "ladder", a.variants) == a.ablation_id
    assert a.name == f"dapo-tiny-ladder-{a.ablation_id[:8]}"


def test_run_names_are_path_safe(cfg) -> None:
    plan = make_ablation(cfg, mode="ladder")
    for child in plan.children:
        ablation, leaf = child.run_name.split("/")
        assert ablation == plan.name and leaf == f"{child.variant.name}-s{child.seed}"
    assert safe_component("my exp/../x y") == "my-exp-..-x-y"
    assert safe_component("../..") == "ablation"
    with pytest.raises(UserError, match="not path-safe"):
        child_run_name("..", "grpo", 0)
    with pytest.raises(UserError, match="not path-safe"):
        child_run_name("a b", "grpo", 0)
    weird = build_config(None, ["tracking.experiment=../../etc"])
    assert make_ablation(weird, mode="ladder", only=["grpo"]).name.startswith("etc-ladder-")


def test_invalid_variant_config_is_reported_before_anything_runs() -> None:
    # overlong buffer longer than L_max is only invalid while shaping is on: naive GRPO passes, rung 3 fails
    cfg = build_config(None, ["algorithm.overlong_buffer.len=999", "algorithm.overlong_buffer.enable=false"])
    with pytest.raises(UserError, match="variant grpo\\+overlong_filtering\\+clip_higher\\+overlong_shaping: .*overlong_buffer.len=999"):
        make_ablation(cfg, mode="ladder")


@pytest.mark.parametrize("config_path", [None, str(REPO / "experiments" / "tiny.yaml")])
@pytest.mark.slow
def test_printed_train_command_resolves_to_the_child_config(config_path) -> None:
    sets = ["trainer.total_steps=3", "data.train_batch_size=8"]
    cfg = resolve(config_path, sets)
    plan = make_ablation(cfg, mode="ladder", seeds=2)
    for child in plan.children:
        words = train_words(plan, child, config_path, sets)
        assert words[:2] == ["dapo", "train"]
        assert resolve_words(words, config_path) == plan.child_config(child)


def resolve_words(words: list[str], config_path: str | None):
    """What ``dapo train`` resolves a printed child command to: its CONFIG, its ``--set``s and its toggles."""
    args = shlex.split(shlex.join(words))[2:]
    config = args.pop(0) if config_path else None
    sets_typed = [args[i + 1] for i, w in enumerate(args) if w == "--set"]
    toggles = {w.removeprefix("--no-").removeprefix("--").replace("-", "_"): not w.startswith("--no-")
               for w in args if w.startswith("--") and w != "--set"}
    return resolve(config, sets_typed, Techniques(**toggles))


# ---------------------------------------------------------------- axes (--axis KEY=V1,V2)


STALENESS = "rollout.max_staleness=0,1"


def test_an_axis_multiplies_the_grid_technique_major_and_names_each_setting(cfg) -> None:
    plan = make_ablation(cfg, mode="grid", techniques=("dynamic_sampling",), axes=parse_axes([STALENESS], cfg))
    tll = "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss"
    assert [v.name for v in plan.variants] == [
        f"{tll}@max_staleness=0", f"{tll}@max_staleness=1", "dapo@max_staleness=0", "dapo@max_staleness=1",
    ]
    assert [v.axes for v in plan.variants] == [(("rollout.max_staleness", v),) for v in ("0", "1", "0", "1")]
    assert [v.toggles for v in plan.variants] == [(("dynamic_sampling", on),) for on in (False, False, True, True)]
    # the label and paper row follow the technique state; the run label carries the setting in a few characters
    assert plan.variants[3].label == "+ Dynamic Sampling (DAPO)" and plan.variants[3].paper == 50
    assert [child_label(v, 0) for v in plan.variants] == ["+TokenLoss@ms=0 s0", "+TokenLoss@ms=1 s0", "DAPO@ms=0 s0", "DAPO@ms=1 s0"]
    assert short_variant("grpo+clip_higher@max_staleness=1@rollout.temperature=0.7") == "grpo+ch@ms=1@temp=0.7"
    for child in plan.children:
        child_cfg = plan.child_config(child)  # validated
        assert child_cfg.rollout.max_staleness == int(child.variant.axes[0][1])
        assert technique_state(child_cfg)["dynamic_sampling"] is (child.index >= 2)
        assert child.run_name == f"{plan.name}/{child.variant.name}-s{child.seed}"  # path-safe: it did not raise
    assert plan.base.rollout.max_staleness == 0  # the base (and its config hash) untouched


def test_the_ladder_takes_axes_too_and_two_axes_make_a_product(cfg) -> None:
    ladder = make_ablation(cfg, mode="ladder", axes=parse_axes([STALENESS], cfg))
    assert len(ladder.variants) == 12
    assert [v.name for v in ladder.variants[:3]] == ["grpo@max_staleness=0", "grpo@max_staleness=1", "grpo+overlong_filtering@max_staleness=0"]
    assert [v.label for v in ladder.variants[:2]] == ["Naive GRPO", "Naive GRPO"]
    axes = parse_axes([STALENESS, "rollout.temperature=1,0.7"], cfg)
    assert [(a.key, a.values, a.short) for a in axes] == [
        ("rollout.max_staleness", ("0", "1"), "max_staleness"),
        ("rollout.temperature", ("1.0", "0.7"), "rollout.temperature"),  # validation.temperature ends in temperature too
    ]
    grid = make_ablation(cfg, mode="grid", techniques=("clip_higher",), only=[], axes=axes)
    assert len(grid.variants) == 8 and len({v.name for v in grid.variants}) == 8
    assert grid.variants[1].name == "grpo+overlong_filtering+overlong_shaping+token_level_loss+dynamic_sampling" \
        "@max_staleness=0@rollout.temperature=0.7"
    assert grid.child_config(grid.children[1]).rollout.temperature == 0.7
    picked = make_ablation(cfg, mode="ladder", axes=parse_axes([STALENESS], cfg), only=["dapo@max_staleness=1"])
    assert [v.name for v in picked.variants] == ["dapo@max_staleness=1"]


def test_without_axes_the_variants_and_ablation_id_are_unchanged(cfg) -> None:
    import hashlib
    import json

    from dapo_cli.ablate.variants import MODES, config_hash

    for mode in MODES:
        plan = make_ablation(cfg, mode=mode, axes=())
        assert plan.variants == tuple(MODES[mode](cfg, TECHNIQUES)) and all(v.axes == () for v in plan.variants)
        # the id hashes the config, the mode and the plain names, as before axes existed
        payload = json.dumps([config_hash(cfg), mode, [v.name for v in plan.variants]])
        assert plan.ablation_id == hashlib.sha256(payload.encode()).hexdigest()[:12]
    with_axis = make_ablation(cfg, mode="grid", axes=parse_axes([STALENESS], cfg))
    assert with_axis.ablation_id != make_ablation(cfg, mode="grid").ablation_id


@pytest.mark.parametrize(("axes", "sets", "message"), [
    (["rollout.max_stalenes=0,1"], [], "unknown config key 'rollout.max_stalenes'; did you mean 'rollout.max_staleness'?"),
    (["rollout.max_staleness=0,x"], [], "rollout.max_staleness must be an integer, got 'x'"),
    (["rollout.max_staleness"], [], "must look like section.key=V1,V2"),
    (["rollout=0,1"], [], "'rollout' is a section"),
    (["rollout.max_staleness=1"], [], "needs at least 2 comma-separated values"),
    (["rollout.max_staleness=0,1,00"], [], "gives the value 0 twice"),
    (["algorithm.filter_groups.enable=true,false"], [], "the technique toggles own it"),
    (["algorithm.clip_ratio_low=0.1,0.2"], [], "the technique toggles own it"),
    (["trainer.seed=1,2"], [], "--seeds sets it"),
    (["trainer.run_name=a,b"], [], "the ablation names every child"),
    (["ablate.jobs=1,2"], [], "ablate.* configures the ablation itself"),
    (["cluster.world_size=1,2"], [], "changes no run's results"),
    (["rollout.max_staleness=0,1"], ["rollout.max_staleness=2"], "--axis rollout.max_staleness and --set rollout.max_staleness=2"),
    ([STALENESS, "rollout.max_staleness=2,3"], [], "--axis rollout.max_staleness is given twice"),
    (["data.train_files=a/b,c"], [], "cannot be part of a run name"),
])
def test_bad_axes_are_one_line_errors(cfg, axes, sets, message) -> None:
    with pytest.raises(UserError, match=re.escape(message)) as err:
        parse_axes(axes, cfg, sets)
    assert "\n" not in str(err.value)


def test_the_policy_loss_and_the_rollout_correction_are_axes(cfg) -> None:
    # --axis algorithm.policy_loss=dapo,gspo,cispo: one row per loss, each child with its loss's own paper defaults;
    # --axis algorithm.rollout_is.mode=...: one row per correction (on stale samples, so that it acts)
    from dapo_cli.config.objectives import correction_args, loss_args

    losses = make_ablation(cfg, mode="grid", techniques=("clip_higher",), axes=parse_axes(["algorithm.policy_loss=dapo,gspo,cispo"], cfg))
    assert [v.name for v in losses.variants][3:] == [f"dapo@policy_loss={n}" for n in ("dapo", "gspo", "cispo")]
    assert [child_label(v, 0) for v in losses.variants][3:] == ["DAPO@pl=dapo s0", "DAPO@pl=gspo s0", "DAPO@pl=cispo s0"]
    children = {c.variant.name: losses.child_config(c) for c in losses.children}
    assert loss_args(children["dapo@policy_loss=gspo"]) == {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}
    assert loss_args(children["dapo@policy_loss=dapo"])["clip_ratio_high"] == 0.28
    stale = ["rollout.max_staleness=1"]
    base = override_config(cfg, stale)
    modes = make_ablation(base, mode="ladder", only=[f"dapo@mode={m}" for m in ("token_tis", "opsm")],
                          axes=parse_axes(["algorithm.rollout_is.mode=token_tis,seq_tis,geo_mask,opsm"], base, stale))
    assert [v.name for v in modes.variants] == ["dapo@mode=token_tis", "dapo@mode=opsm"]
    assert [correction_args(modes.child_config(c)) for c in modes.children] == [{"cap": 2.0}, {"opsm_delta": 1e-4}]


def test_an_axis_value_the_child_config_rejects_fails_before_anything_runs(cfg) -> None:
    with pytest.raises(UserError, match=re.escape("variant dapo@max_staleness=-1: rollout.max_staleness=-1 must be >= 0")):
        make_ablation(cfg, mode="ladder", only=["dapo@max_staleness=-1"], axes=parse_axes(["rollout.max_staleness=-1,0"], cfg))


def test_technique_keys_are_what_the_toggles_write_and_read(cfg) -> None:
    from dapo_cli.config import apply_techniques, flatten
    from dapo_cli.config.techniques import TECHNIQUE_KEYS

    before = flatten(cfg)
    written = {k for t in TECHNIQUES for on in (False, True) for k, v in flatten(apply_techniques(cfg, **{t: on})).items()
               if v != before[k]}
    assert written == set(TECHNIQUE_KEYS) - {"algorithm.clip_ratio_low"}  # clip-higher compares high with low


@pytest.mark.slow
def test_printed_train_command_of_an_axis_child_resolves_to_its_config(cfg) -> None:
    plan = make_ablation(cfg, mode="grid", techniques=("dynamic_sampling",), axes=parse_axes([STALENESS], cfg))
    for child in plan.children:
        words = train_words(plan, child, None, [])
        assert f"rollout.max_staleness={child.variant.axes[0][1]}" in words
        assert resolve_words(words, None) == plan.child_config(child)


def test_a_key_the_schema_gains_at_its_old_behaviour_leaves_the_ablation_id_as_it_was(cfg, monkeypatch) -> None:
    """Simulated: the schema gains ``trainer.new_knob`` (declared in ADDED_KEYS at version 2, default = what dapo did
    before): the same experiment keeps its config hash, and so its ablation id; set otherwise, the knob counts."""
    from dapo_cli.ablate import variants
    from dapo_cli.config import versions

    before = make_ablation(cfg, mode="ladder")
    real = variants.flatten

    def with_knob(c):
        return {**real(c), "trainer.new_knob": getattr(c, "_knob", 0)}

    monkeypatch.setattr(variants, "flatten", with_knob)
    monkeypatch.setitem(versions.ADDED_KEYS, "trainer.new_knob", versions.Added(2, "0: what dapo did before it"))
    monkeypatch.setattr(versions, "flatten", with_knob)
    assert make_ablation(cfg, mode="ladder").ablation_id == before.ablation_id
    knobbed = dataclasses.replace(cfg)
    object.__setattr__(knobbed, "_knob", 3)
    assert variants.config_hash(knobbed) != variants.config_hash(cfg)
