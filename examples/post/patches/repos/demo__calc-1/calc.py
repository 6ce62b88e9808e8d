"""A tiny calculator."""


def mean(values):
    """Arithmetic mean of a list of numbers."""
    return sum(values) / len(values)


def clamp(x, lo, hi):
    return max(lo, min(x, hi))
