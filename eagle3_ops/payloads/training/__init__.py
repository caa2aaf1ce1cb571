"""The EAGLE-3 training job: token budget, OOM back-off, resume, metrics, data regeneration."""
