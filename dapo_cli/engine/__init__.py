"""Training engines: log-probs, backward, optimizer step, state for checkpoints.

``base.TrainingEngine`` is the protocol; ``torch.TorchEngine`` runs on one CPU or
GPU; ``deepspeed`` (ZeRO, clusters) lives in its own module, imported only when
``engine.name: deepspeed`` is selected.
"""

from dapo_cli.engine.base import TrainingEngine

__all__ = ["TrainingEngine"]
