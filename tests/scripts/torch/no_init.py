"""Imports torch but never calls init_process_group (test fixture)."""

import torch

print(f"hello from a script that trains alone: {torch.ones(2).sum().item()}", flush=True)
