"""The loss and correction settings (``config/objectives.py``): one table per registry, checked against the schema's
choices and the functions' own keyword arguments, each loss's paper defaults, what a choice ignores."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from dapo_cli.algo.objectives import POLICY_LOSS_NAMES, POLICY_LOSSES
from dapo_cli.algo.rollout_correction import ROLLOUT_CORRECTION_NAMES, ROLLOUT_CORRECTIONS, ROW_FILTERS
from dapo_cli.config import load_config
from dapo_cli.config.objectives import CORRECTION_SETTINGS, LOSS_SETTINGS, correction_args, ignored_settings, loss_args
from dapo_cli.config.schema import (
    POLICY_LOSSES as SCHEMA_LOSSES,
    ROLLOUT_CORRECTIONS as SCHEMA_CORRECTIONS,
    ROW_DROPPING_CORRECTIONS,
    ConfigError,
    old_log_probs_from_update,
)

TINY = Path(__file__).resolve().parents[2] / "experiments" / "tiny.yaml"
COMMON = {"loss_agg_mode", "global_tokens", "global_seqs", "norm_length", "token_weights"}
"""What the update passes to every loss besides its own settings."""


def keyword_only(fn) -> set[str]:
    return {n for n, p in inspect.signature(fn).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_the_schemas_choices_are_the_registries():
    assert SCHEMA_LOSSES == POLICY_LOSS_NAMES == tuple(LOSS_SETTINGS) == ("dapo", "gspo", "cispo", "gmpo")
    assert SCHEMA_CORRECTIONS == ROLLOUT_CORRECTION_NAMES == tuple(CORRECTION_SETTINGS)
    assert ROW_DROPPING_CORRECTIONS == tuple(ROW_FILTERS) == ("geo_mask",)


@pytest.mark.parametrize("name", POLICY_LOSS_NAMES)
def test_each_loss_reads_exactly_the_settings_its_table_lists(name):
    own = keyword_only(POLICY_LOSSES[name]) - COMMON
    assert own == {key.rsplit(".", 1)[1] for key in LOSS_SETTINGS[name]}


@pytest.mark.parametrize("mode", ROLLOUT_CORRECTION_NAMES)
def test_each_correction_reads_exactly_the_settings_its_table_lists(mode):
    assert keyword_only(ROLLOUT_CORRECTIONS[mode]) == {key.rsplit(".", 1)[1] for key in CORRECTION_SETTINGS[mode]}
    if mode in ROW_FILTERS:
        assert keyword_only(ROW_FILTERS[mode]) == keyword_only(ROLLOUT_CORRECTIONS[mode])


def test_each_loss_gets_its_own_papers_defaults():
    assert loss_args(load_config(TINY)) == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": None}
    assert loss_args(load_config(TINY, ["algorithm.policy_loss=gspo"])) == {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}
    assert loss_args(load_config(TINY, ["algorithm.policy_loss=cispo"])) == {"clip_ratio_low": None, "clip_ratio_high": 3.0}
    assert loss_args(load_config(TINY, ["algorithm.policy_loss=gmpo"])) == {"log_clip_low": 0.4, "log_clip_high": 0.4}
    # the DAPO clip keys do not move GSPO's
    cfg = load_config(TINY, ["algorithm.policy_loss=gspo", "algorithm.clip_ratio_high=0.4", "algorithm.gspo.clip_ratio_high=1e-3"])
    assert loss_args(cfg) == {"clip_ratio_low": 3e-4, "clip_ratio_high": 1e-3}


def test_each_correction_gets_its_own_setting():
    on = ["algorithm.rollout_is.enable=true"]
    assert correction_args(load_config(TINY, on)) == {"cap": 2.0}
    assert correction_args(load_config(TINY, [*on, "algorithm.rollout_is.mode=seq_tis"])) == {"cap": 2.0}
    assert correction_args(load_config(TINY, [*on, "algorithm.rollout_is.mode=geo_mask"])) == {"geo_bound": 1.001}
    assert correction_args(load_config(TINY, [*on, "algorithm.rollout_is.mode=opsm"])) == {"opsm_delta": 1e-4}


def test_ignored_settings_name_what_the_choices_do_not_read():
    assert ignored_settings(load_config(TINY)) == []
    assert ignored_settings(load_config(TINY, ["algorithm.policy_loss=gspo"])) == []  # defaults are not "set"
    found = ignored_settings(load_config(TINY, ["algorithm.policy_loss=cispo", "algorithm.clip_ratio_high=0.2",
                                                "algorithm.gspo.clip_ratio_low=1e-3"]))
    assert [(k, fix) for k, _, fix in found] == [
        ("algorithm.clip_ratio_high", "drop it, or set algorithm.policy_loss=dapo"),
        ("algorithm.gspo.clip_ratio_low", "drop it, or set algorithm.policy_loss=gspo"),
    ]
    stale = load_config(TINY, ["rollout.max_staleness=1", "algorithm.rollout_is.mode=geo_mask", "algorithm.rollout_is.cap=3"])
    assert [k for k, *_ in ignored_settings(stale)] == ["algorithm.rollout_is.cap"]
    off = load_config(TINY, ["algorithm.rollout_is.mode=seq_tis", "algorithm.rollout_is.cap=3"])
    assert [k for k, *_ in ignored_settings(off)] == ["algorithm.rollout_is.mode", "algorithm.rollout_is.cap"]


def test_a_row_dropping_correction_needs_the_old_log_probs_before_the_update():
    one_step = ["data.train_batch_size=8", "trainer.ppo_mini_batch_size=8"]
    assert old_log_probs_from_update(load_config(TINY, one_step))
    assert old_log_probs_from_update(load_config(TINY, [*one_step, "algorithm.rollout_is.enable=true", "algorithm.rollout_is.mode=opsm"]))
    assert not old_log_probs_from_update(load_config(TINY, [*one_step, "algorithm.rollout_is.enable=true",
                                                            "algorithm.rollout_is.mode=geo_mask"]))
    assert old_log_probs_from_update(load_config(TINY, [*one_step, "algorithm.rollout_is.mode=geo_mask"]))  # no correction runs


@pytest.mark.parametrize(("override", "message"), [
    ("algorithm.policy_loss=grpo", "algorithm.policy_loss"),
    ("algorithm.rollout_is.mode=token", "algorithm.rollout_is.mode"),
    ("algorithm.gspo.clip_ratio_low=1.5", "algorithm.gspo.clip_ratio_low=1.5 must be in [0, 1)"),
    ("algorithm.cispo.clip_ratio_high=0", "algorithm.cispo.clip_ratio_high=0.0 must be > 0"),
    ("algorithm.cispo.clip_ratio_low=0", "algorithm.cispo.clip_ratio_low=0.0 must be in (0, 1]"),
    ("algorithm.rollout_is.geo_bound=0.999", "algorithm.rollout_is.geo_bound=0.999 must be > 1"),
    ("algorithm.gmpo.log_clip_low=0", "algorithm.gmpo.log_clip_low=0.0 must be > 0"),
    ("algorithm.rollout_is.opsm_delta=-1", "algorithm.rollout_is.opsm_delta=-1.0 must be >= 0"),
])
def test_bad_values_are_one_line_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config(TINY, [override])
