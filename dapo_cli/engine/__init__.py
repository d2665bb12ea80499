"""Training engines: log-probs, backward, optimizer step, weights for rollouts, checkpoints.

``base.TrainingEngine`` is the protocol and ``dist.Collective`` its ranks and collectives;
``torch.TorchEngine`` runs one process (torch DDP under torchrun; LoRA adapters through PEFT with
``lora.LoraAdapters``, PEFT imported only when ``model.lora.rank > 0``); ``deepspeed.DeepSpeedEngine``
(ZeRO 0-3) lives in its own module, imported only when ``engine.name: deepspeed`` is selected.
``dapo_cli.components`` builds them.
"""

from dapo_cli.engine.base import TrainingEngine
from dapo_cli.engine.dist import Collective, SingleProcess

__all__ = ["Collective", "SingleProcess", "TrainingEngine"]
