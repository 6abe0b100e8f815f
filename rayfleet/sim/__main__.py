"""``python -m rayfleet.sim``: the ``rayfleet sim`` commands (used by ``SimFleetProcess``)."""

from rayfleet.sim.command import main

main()
