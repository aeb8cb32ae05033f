"""The passive adversary: eavesdropper capture, transcript attack and leakage measurement."""

__all__: list[str] = []
