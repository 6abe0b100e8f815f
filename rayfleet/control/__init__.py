"""Control plane: ``rayfleet up`` / ``status`` / ``down`` and the fleet they run.

    command.py      the three commands: parse, call lifecycle, print
    lifecycle.py    load the fleet, dry run, serve in the foreground or detached,
                    read the running fleet's status, stop it and what it left
    fleet.py        FleetProcess: Ray, Serve applications, the gateway, the run state
    replica.py      a Serve replica that runs one vLLM server and registers it
    placement.py    what a replica asks Ray for, where it fits, the GPUs its server sees
    registry.py     FleetRegistry, the actor where replicas announce themselves
    engine.py       EngineProcess: one vLLM server as a child process
    engine_args.py  fleet.yaml engine_args as vLLM flags, checked by vLLM's parser
    state.py        RunState, the file that connects up with status and down

Ray and vLLM are imported inside the functions that need them: ``--help`` imports
neither, and ``up --dry-run`` imports only vLLM's argument parser.
"""
