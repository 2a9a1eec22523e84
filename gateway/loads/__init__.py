"""The load level of the budget (design.md section 2): whether a model may load on a backend's GPU(s) now, at what
context, after which unloads; what each GPU holds. The sequence level (does a request's KV fit its model's pool) is
``gateway.admission``.

    gpu_ledger.py    GpuBudget / fits_load / plan_load: where one backend's GPU bytes go, the one fit decision  pure
    plan.py          decide_load -> LOAD | WAIT | REFUSE, the unload candidates, least valuable first          pure
    preview.py       a load decision as a routing preview (RESIDENT, FITS, EVICTS, CANNOT, UNKNOWN)            pure
    offload.py       when_gpu_full: a refused load run partly on the CPU, made to wait, or refused             pure*
    residency.py     where a model stands among /api/ps's loaded models, for /kvgate/fit and `kvgate estimate` pure
    keep_alive.py    a client's keep_alive 0 / negative on Ollama's routes: stripped, refused or allowed      pure
    oom.py           a GPU out-of-memory after a load was admitted: one retry, else 503                        pure
    gpu_reading.py   one backend's GpuBudget read live (VRAM source, resident models, loads in flight)        I/O
    gate.py          LoadGate: the I/O around decide_load (unloads, reservations, the wait, the claim)        I/O
    backend_lock.py  the lock a backend's residency is decided under: local, and the shared lease             I/O
    shared_gpu.py    one GPU ledger across replicas: a lease per backend in Redis, loads in flight, loaded at  I/O
    oom_catch.py     the backend's out-of-memory 500, caught before it reaches the client                      I/O
    load_requests.py Ollama's load and unload requests (no messages, no prompt) through the load gate        I/O
    (* one read of /proc/meminfo)

Dependencies go one way: ``gateway.admission`` (the admitter, the pool directory) calls the load gate; nothing here
imports ``gateway.admission`` at run time (load_requests.py names the admitter's type only). The one thing the gate
reads of the sequence level, kvgate's active sequences on a model, comes through the ``ActiveSequences`` protocol
(gate.py), which the waiting room satisfies. Below this package: ``gateway.memory`` (load cost, VRAM readings, the
estimate), ``gateway.backends`` (probes, model names), ``gateway.config``, and for load requests ``gateway.dialects``
and ``gateway.fitting`` (tests/test_layers.py).
The package has no facade: import the module you need, so the pure modules stay light.
"""
