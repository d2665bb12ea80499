"""The ``cluster`` section: the cluster a config is written for. It plans (``dapo train --dry-run``) and
trains nothing, so it is checked like every value but changes no ablation id and never blocks ``--resume``."""

from __future__ import annotations

import dataclasses

import pytest

from dapo_cli.ablate.variants import config_hash
from dapo_cli.config import ConfigError, load_config, to_dict
from dapo_cli.checkpoint import resume_blockers


def test_the_default_plans_for_the_environment_or_one_rank_of_an_80_gib_node_of_8():
    cluster = load_config(None).cluster
    assert (cluster.world_size, cluster.gpus_per_node, cluster.gpu_memory_gib) == (0, 8, 80.0)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("cluster.world_size", "-1", "cluster.world_size=-1 must be >= 0 (0: $WORLD_SIZE, else 1)"),
    ("cluster.gpus_per_node", "0", "cluster.gpus_per_node=0 must be >= 1"),
    ("cluster.gpu_memory_gib", "0", "cluster.gpu_memory_gib=0.0 must be > 0"),
])
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message.replace("$", r"\$").replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [f"{key}={value}"])


def test_the_cluster_changes_no_ablation_id():
    base = load_config(None)
    other = load_config(None, ["cluster.world_size=128", "cluster.gpus_per_node=4", "cluster.gpu_memory_gib=141"])
    assert config_hash(other) == config_hash(base)
    assert config_hash(load_config(None, ["trainer.lr=2e-6"])) != config_hash(base)  # a training setting does


def test_a_run_saved_before_the_section_existed_resumes():
    current = to_dict(load_config(None, ["trainer.total_steps=9"]))
    saved = {k: v for k, v in current.items() if k != "cluster"}  # config.yaml of an older dapo
    assert resume_blockers(saved, current) == []
    changed = to_dict(dataclasses.replace(load_config(None), cluster=load_config(None, ["cluster.world_size=8"]).cluster))
    assert resume_blockers(current, changed) == []
    assert resume_blockers(current, to_dict(load_config(None, ["trainer.lr=2e-6", "trainer.total_steps=9"]))) == ["trainer.lr"]
