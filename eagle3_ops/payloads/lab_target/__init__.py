"""Lab-only payloads: the tiny target model and the CPU shim for speculators' trainer."""
