"""What vLLM's CPU build needs to run speculators' hidden-state extraction where there is no GPU (the lab)."""
