"""``kvgate check``: the troubleshooting steps of facts/troubleshooting.md, automated.

    gather.py      the I/O: the backend's answers, the VRAM source, /proc/meminfo, the kernel log, log files
    readings.py    what was gathered, as frozen data (the one input of the diagnosis)
    diagnose.py    pure: readings -> findings (host memory, GPU, models, context, cache type, logs)
    signatures.py  pure: the known out-of-memory messages, as a table, and the matcher
    backend_log.py pure: settings a backend's log reveals (slots, unified, cache types, flash attention, OLLAMA_*)
    fixes.py       pure: which setting of which backend turns which knob, and the Finding data types
    render.py      text for people, JSON for scripts; the exit code
    bundle.py      the support bundle (``--report``), with every secret scrubbed
    cli.py         the subcommand's arguments and its run
"""
