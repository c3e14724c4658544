"""fp8 checkpoints on a card without fp8: the form weights take (policy), the loaders and layers that give it."""
