"""Checkpoints read from disk and models moved to the card: mmap, the VAE's dtype, the moves' account."""
