"""Control plane: ``rayfleet up`` / ``status`` / ``scale`` / ``apply`` / ``down`` and the
fleet they run.

    command.py      the commands: parse, call lifecycle, print
    lifecycle.py    load the fleet, dry run, serve in the foreground or detached,
                    read the running fleet's status, call its admin endpoints, stop it
    fleet.py        FleetProcess: Ray, Serve applications, the gateway, the scaler, the
                    run state
    deploy.py       connect to Ray, run each model's Serve application, read their state
    scheduling.py   replica shapes the cluster cannot hold, the placement deadline
    replica.py      a Serve replica that runs one vLLM server (rank 0) and registers it
    ranks.py        the other ranks of a replica that spans nodes; headless.py runs one
    drain.py        a leaving replica finishes its requests before its server stops
    placement.py    what a replica asks Ray for, where it fits, the GPUs its server sees
    scaling.py      FleetScaler: each model's target count from load and windows
    autoscaler.py   the pure scaling decision; windows.py the bounds a schedule sets;
                    load_signal.py vLLM's running / waiting / KV gauges
    admin.py        the fleet's admin endpoints (scale, apply), loopback only
    apply.py        the diff between the running fleet and a new file; rollout.py
                    carries it out (blue/green for changed models)
    registry.py     FleetRegistry, the actor where replicas announce themselves
    engine.py       EngineProcess: one vLLM server (or headless rank) as a child process
    engine_args.py  fleet.yaml engine_args as vLLM flags, checked by vLLM's parser
    state.py        RunState, the file that connects up with status and down

Ray and vLLM are imported inside the functions that need them: ``--help`` imports
neither, and ``up --dry-run`` imports only vLLM's argument parser.
"""
