"""dapo: a command-line experiment toolkit for DAPO reinforcement learning of LLMs.

DAPO = Decoupled Clip and Dynamic sAmpling Policy Optimization (Yu et al., 2025,
arXiv:2503.14476). See docs/architecture.md for the layers and docs/dapo.md for the
paper-to-code map.
"""

__version__ = "0.1.0"
