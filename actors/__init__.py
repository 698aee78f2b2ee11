"""Ray actors: one model pair per GPU (or per CPU slot on a CPU-only cluster)."""
