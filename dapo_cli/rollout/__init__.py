"""Rollout engines: turn prompts into sampled responses.

``base.RolloutEngine`` is the protocol; ``fast.FastRolloutEngine`` (the default: its own decode loop) and
``hf.HFRolloutEngine`` (transformers' ``generate``) sample in this process, on CPU or GPU;
``vllm.VLLMRolloutEngine`` (CUDA, or vLLM's CPU build) lives in its own module and is imported only when
selected.
"""

from dapo_cli.rollout.base import RolloutEngine, Rollouts, SamplingParams

__all__ = ["RolloutEngine", "Rollouts", "SamplingParams"]
