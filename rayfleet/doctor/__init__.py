"""``rayfleet doctor``: independent checks on every node of a Ray cluster.

``probe.py`` runs on each node and reads facts; ``checks.py`` judges them; ``network.py``
measures the links between nodes; ``runner.py`` drives it all on Ray; ``report.py``
prints it.
"""
