"""Standalone runtime: manifests, cuda-python loader and launcher, heuristics, torch ops. Never imports the CuTe DSL."""
