"""The benchmark, tuning and report: cutegen's kernels timed beside anchors measured in the same run."""
