"""Serving payloads: the lab's CPU EAGLE-3 reference engine and the benchmark client."""
