"""``make bench``: the grader's timings against the floor, otter-grader, scale and memory (see run.py)."""
