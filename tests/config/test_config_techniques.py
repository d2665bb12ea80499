"""Tests for ``dapo_cli.config.techniques``: the five DAPO techniques as booleans over the schema."""

from __future__ import annotations

import dataclasses

import pytest

from dapo_cli.config import TECHNIQUES, Config, apply_techniques, flatten, technique_state
from dapo_cli.config.techniques import PAPER_CLIP_RATIO_HIGH, variant_name

ALL_OFF = dict.fromkeys(TECHNIQUES, False)
ALL_ON = dict.fromkeys(TECHNIQUES, True)


def test_order_follows_the_paper_ablation_table() -> None:
    # DAPO Table 1: naive GRPO, + overlong filtering, + clip-higher, + soft overlong
    # punishment, + token-level loss, + dynamic sampling (= DAPO)
    assert TECHNIQUES == ("overlong_filtering", "clip_higher", "overlong_shaping", "token_level_loss", "dynamic_sampling")
    assert PAPER_CLIP_RATIO_HIGH == 0.28


def test_schema_defaults_have_every_technique_on() -> None:
    assert technique_state(Config()) == ALL_ON


def test_state_is_derived_from_the_fields() -> None:
    cfg = Config()
    cfg.algorithm.overlong_filter = False
    cfg.algorithm.clip_ratio_high = 0.2  # = clip_ratio_low
    cfg.algorithm.overlong_buffer.enable = False
    cfg.algorithm.loss_agg_mode = "seq-mean-token-sum"  # anything but token-mean is not the token-level loss
    cfg.algorithm.filter_groups.enable = False
    assert technique_state(cfg) == ALL_OFF
    cfg.algorithm.clip_ratio_high = 0.2000001  # strictly above epsilon_low counts as clip-higher
    assert technique_state(cfg)["clip_higher"] is True


# technique -> (dotted key, value when on, value when off), starting from Config() (clip_ratio_low = 0.2)
FIELDS = {
    "overlong_filtering": ("algorithm.overlong_filter", True, False),
    "clip_higher": ("algorithm.clip_ratio_high", 0.28, 0.2),
    "overlong_shaping": ("algorithm.overlong_buffer.enable", True, False),
    "token_level_loss": ("algorithm.loss_agg_mode", "token-mean", "seq-mean-token-mean"),
    "dynamic_sampling": ("algorithm.filter_groups.enable", True, False),
}


@pytest.mark.parametrize("technique", TECHNIQUES)
def test_each_toggle_changes_only_its_field(technique: str) -> None:
    key, on_value, off_value = FIELDS[technique]
    base = flatten(Config())
    off = apply_techniques(Config(), **{technique: False})
    assert technique_state(off) == {**ALL_ON, technique: False}
    assert flatten(off) == {**base, key: off_value}
    back_on = apply_techniques(off, **{technique: True})
    assert technique_state(back_on) == ALL_ON
    assert flatten(back_on) == {**base, key: on_value}


def test_all_off_then_all_on() -> None:
    grpo = apply_techniques(Config(), **ALL_OFF)
    assert technique_state(grpo) == ALL_OFF
    assert grpo.algorithm.clip_ratio_high == grpo.algorithm.clip_ratio_low == 0.2
    assert grpo.algorithm.loss_agg_mode == "seq-mean-token-mean"
    assert apply_techniques(grpo, **ALL_ON) == Config()


def test_none_leaves_a_technique_as_is() -> None:
    cfg = apply_techniques(Config(), clip_higher=False)
    assert apply_techniques(cfg, **dict.fromkeys(TECHNIQUES, None)) == cfg
    assert apply_techniques(cfg) == cfg


def test_clip_higher_on_keeps_a_configured_epsilon_high() -> None:
    cfg = Config()
    cfg.algorithm.clip_ratio_high = 0.35
    assert apply_techniques(cfg, clip_higher=True).algorithm.clip_ratio_high == 0.35
    # switched on from below epsilon_low too, not only from equality
    cfg.algorithm.clip_ratio_high = 0.1
    assert apply_techniques(cfg, clip_higher=True).algorithm.clip_ratio_high == 0.28


def test_clip_higher_off_follows_a_configured_epsilon_low() -> None:
    cfg = Config()
    cfg.algorithm.clip_ratio_low = 0.15
    off = apply_techniques(cfg, clip_higher=False)
    assert off.algorithm.clip_ratio_high == 0.15
    assert off.algorithm.clip_ratio_low == 0.15


def test_apply_returns_a_copy() -> None:
    cfg = Config()
    before = dataclasses.replace(cfg)
    apply_techniques(cfg, **ALL_OFF)
    assert cfg == before
    assert technique_state(cfg) == ALL_ON


def test_unknown_technique_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown technique.*'clip_hgher'.*valid: overlong_filtering, clip_higher"):
        apply_techniques(Config(), clip_hgher=True)


@pytest.mark.parametrize(
    ("state", "name"),
    [
        (ALL_ON, "dapo"),
        (ALL_OFF, "grpo"),
        ({**ALL_OFF, "clip_higher": True}, "grpo+clip_higher"),
        ({**ALL_ON, "overlong_filtering": False}, "grpo+clip_higher+overlong_shaping+token_level_loss+dynamic_sampling"),
        ({**ALL_OFF, "dynamic_sampling": True, "overlong_filtering": True}, "grpo+overlong_filtering+dynamic_sampling"),
    ],
)
def test_variant_name(state: dict[str, bool], name: str) -> None:
    assert variant_name(state) == name


def test_each_technique_s_row_points_at_code_a_metric_and_a_doc_heading_that_exist() -> None:
    import importlib
    import re
    from pathlib import Path

    from dapo_cli.config.techniques import CLI_ORDER, TECHNIQUE_KEYS, TECHNIQUE_TABLE, TECHNIQUES

    root = Path(__file__).resolve().parents[2]
    assert TECHNIQUES == ("overlong_filtering", "clip_higher", "overlong_shaping", "token_level_loss", "dynamic_sampling")
    assert sorted(CLI_ORDER) == sorted(TECHNIQUES) and len(TECHNIQUE_KEYS) == len(set(TECHNIQUE_KEYS))
    source = "\n".join(p.read_text() for p in (root / "dapo_cli").rglob("*.py"))
    for t in TECHNIQUE_TABLE:
        module, _, attr = t.implementation.rpartition(".")
        assert callable(getattr(importlib.import_module(f"dapo_cli.{module}"), attr)), t.implementation
        assert f'"{t.metric}"' in source, t.metric  # logged by name somewhere in the package
        path, _, anchor = t.doc.partition("#")
        headings = re.findall(r"^#+ (.+)$", (root / path).read_text(), flags=re.MULTILINE)
        assert anchor in {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}, t.doc
        assert t.implementation.rsplit(".", 1)[1] in (root / path).read_text()  # the doc names the function
    # the DAPO loss is named for what it is: the decoupled clip is found under its technique's name
    losses = (root / "dapo_cli" / "algo" / "losses.py").read_text()
    assert "def dapo_loss(" in losses and "clip-higher" in losses


def test_the_table_drives_the_toggles_both_ways() -> None:
    from dapo_cli.config import load_config
    from dapo_cli.config.techniques import TECHNIQUE_TABLE, apply_techniques, technique_state

    base = load_config(None)
    for t in TECHNIQUE_TABLE:
        off = apply_techniques(base, **{t.name: False})
        assert technique_state(off) == {**technique_state(base), t.name: False}, t.name
        assert technique_state(apply_techniques(off, **{t.name: True}))[t.name] is True
