"""Kernel templates (CuTe DSL) and the jinja2 templates of emitted artifacts."""
