"""Composition points for a whole run on one machine: the testbed (broker, eavesdropper, nodes).

Like :mod:`nlagg_node.cli`, this package may import both ``nlagg_node`` and ``adversary``: it starts
an eavesdropper beside the nodes and reads its transcript. Nothing else in ``nlagg_node`` imports
``adversary`` (``tests/unit/test_architecture.py`` enforces it).
"""
