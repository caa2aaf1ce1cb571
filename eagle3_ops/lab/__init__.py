"""The local lab: a pct CLI over LXC and emulated NVIDIA GPUs (both also run standalone)."""
