"""The ablation plan: ladder rungs in the paper's order, grids, filters, seeds, names and ids (pure, no training)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from dapo_cli.ablate.variants import (
    LADDER_LABELS,
    PAPER_AIME24_AVG32,
    ablation_id,
    child_run_name,
    make_ablation,
    parse_techniques,
    safe_component,
)
from dapo_cli.ablate.child import train_words
from dapo_cli.cli.options import resolve
from dapo_cli.config import TECHNIQUES, load_config, technique_state
from dapo_cli.config.load import build_config
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
    for rung, child in enumerate(plan.children()):
        child_cfg = plan.child_config(child)
        # rung r has exactly the first r techniques on, measured on the config it will train
        assert technique_state(child_cfg) == {t: j < rung for j, t in enumerate(TECHNIQUES)}
        assert child.index == rung
    naive = plan.child_config(plan.children()[0]).algorithm
    # naive GRPO: symmetric clip 0.2, seq-mean-token-mean, no shaping, no filtering, no dynamic sampling
    assert (naive.clip_ratio_low, naive.clip_ratio_high) == (0.2, 0.2)
    assert naive.loss_agg_mode == "seq-mean-token-mean"
    assert not naive.overlong_buffer.enable and not naive.overlong_filter and not naive.filter_groups.enable
    assert plan.child_config(plan.children()[2]).algorithm.clip_ratio_high == 0.28


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
    for child in plan.children():
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
    assert [(c.variant.name, c.seed) for c in plan.children()] == [
        ("grpo", 7), ("dapo", 7), ("grpo", 8), ("dapo", 8), ("grpo", 9), ("dapo", 9),
    ]
    assert plan.child_config(plan.children()[3]).trainer.seed == 8
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
    for child in plan.children():
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
    for child in plan.children():
        words = train_words(plan, child, config_path, sets)
        assert words[:2] == ["dapo", "train"]
        args = shlex.split(shlex.join(words))[2:]
        config = args.pop(0) if config_path else None
        sets_typed = [args[i + 1] for i, w in enumerate(args) if w == "--set"]
        toggles = {w.removeprefix("--no-").removeprefix("--").replace("-", "_"): not w.startswith("--no-")
                   for w in args if w.startswith("--") and w != "--set"}
        assert resolve(config, sets_typed, **toggles) == plan.child_config(child)
