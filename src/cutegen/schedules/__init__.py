"""Schedule vocabulary and schedule files (no CuTe DSL, no other project imports)."""
